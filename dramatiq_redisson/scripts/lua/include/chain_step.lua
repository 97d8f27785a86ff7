-- chain_step: periodic chaining, included by transfer.lua (see schedule.lua).
--
-- A schedule has one tick scheduled at any time: its chained tick (message id
-- "periodic:<name>:<tick ms>", named by the chains HASH). When that tick moves, the next
-- one is scheduled in the same step: the first time in "<name>|t" (schedule state)
-- after it, with the same payload but the new time as its timestamp. A time in "|t" may
-- carry its jitter, "<tick>+<offset>": the tick is then due at tick + offset (its message
-- id, sort key and timestamp stay the tick's). A tick that moves late (more than c.grace
-- ms after it was due, or after the next tick was due too: every worker was down) is not
-- run: the chain stops, "|s" records the tick, and the caller resumes it by the
-- schedule's catch-up policy (periodic/_schedules.py); so does a chain that ran out of times. Both,
-- and a chain with fewer than c.low_water times left, are named in c.attend.
--
-- Policies (issue 50; fields of the schedule state, see schedule.lua): with "|o" = "skip"
-- a tick is skipped (counted in "|k"; the chain goes on) while the run it last enqueued
-- ("|u", a redis message id) is still scheduled (a retry: its message id in c.payloads) or
-- in c.ready_msgs (ready, or in flight until acked: a killed worker's message stays there
-- until liveness gives it back to the ready queue, and runs again). A retry of that run
-- that moves becomes "|u". Each tick run counts in "|n"; with "|m" (a limit) the run that
-- reaches it is the last: the chain ends, "|e" = "limit", and the schedule is named in
-- c.attend (the caller logs it once).
--
-- c: {chains, state (the schedule state HASH), zset, backup, payloads, ready_msgs, now_ms,
--     grace, low_water, writes = {}, attend = {}}
-- chain_step(c, member, body, due_ms): reads only (the caller's first write comes
--   later); queues the writes in c.writes. Returns whether the message runs (false: a
--   missed or skipped tick, its payload to drop); true as well for a member that is not
--   its schedule's chained tick (an ordinary message: a retry of a tick, a tick run by
--   hand).
-- chain_write(c, step) (chain_write.lua): the writes of one step, after the caller's
--   first write.

-- include: message_id_of.lua
local function chain_step(c, member, body, due_ms)
    local message_id = message_id_of(member)
    local name, tick = string.match(message_id, "^periodic:(.+):(%d+)$")
    if not name then
        return true
    end
    if redis.call("HGET", c.chains, name) ~= member then
        local current = redis.call("HGET", c.state, name .. "|u")
        if current and current ~= member and message_id_of(current) == message_id then
            c.writes[#c.writes + 1] = {name = name, current = member} -- a retry of the current run
        end
        return true
    end
    tick = tonumber(tick)
    local got = redis.call("HMGET", c.state, name .. "|t", name .. "|o", name .. "|u", name .. "|m", name .. "|n")
    -- The upcoming times are in time order: only the first after this tick is parsed, the
    -- rest stays text (parsing all of them cost a tick about 10 k instructions per time,
    -- 64 ahead: issue 55).
    local list, at, rest, pos = got[1] or "", nil, "", 1
    local following = nil
    while true do
        local from, to, time, jitter = string.find(list, "^(%d+)(%+?%d*),?", pos)
        if not from then
            break
        end
        if tonumber(time) > tick then
            at, rest = time, string.sub(list, to + 1)
            following = tonumber(time) + (tonumber(string.sub(jitter, 2)) or 0)
            break
        end
        pos = to + 1
    end
    -- How many times are left after the next one, counted up to the low-water mark.
    local left, from = rest ~= "" and 1 or 0, 1
    while left > 0 and left < c.low_water do
        local comma = string.find(rest, ",", from, true)
        if not comma or comma == #rest then
            break
        end
        left, from = left + 1, comma + 1
    end
    local run = c.now_ms - due_ms <= c.grace and not (following and following <= c.now_ms)
    local skip, last = false, false
    if run and got[2] == "skip" and got[3] then
        skip = redis.call("HEXISTS", c.ready_msgs, got[3]) == 1
            or redis.call("HEXISTS", c.payloads, message_id_of(got[3])) == 1
    end
    if run and not skip and got[4] then
        last = (tonumber(got[5]) or 0) + 1 >= tonumber(got[4])
    end
    c.writes[#c.writes + 1] = {
        name = name, run = run, skip = skip, last = last, tick = tick, due_ms = due_ms, body = body,
        at = at, due = following, rest = rest, member = member, overlap = got[2] == "skip"
    }
    if not run or last or not following or left < c.low_water then
        c.attend[#c.attend + 1] = name
    end
    return run and not skip
end
