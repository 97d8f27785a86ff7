-- schedule: change a periodic actor's schedule, atomically (see _periodic.py).
--
-- A schedule is a chain of delayed messages: exactly one tick of it is scheduled at a
-- time, in the queue's ZSET, and transfer.lua, when it moves that tick, schedules the next
-- one in the same step. The next tick times come from the client (cron needs a time zone
-- database), a few dozen ahead, in KEYS[3]'s "<name>|t" field.
--
-- KEYS[1]  HASH  redisson_delay_queue_schedules:{N}      name -> definition (JSON)
-- KEYS[2]  HASH  redisson_delay_queue_chains:{N}         name -> member of the scheduled tick
-- KEYS[3]  HASH  redisson_delay_queue_schedule_state:{N} "<name>|t" upcoming ticks (epoch ms,
--                comma-separated), "|r" last tick run, "|l" its lateness (ms), "|s" the
--                first tick not run while the chain waits to be resumed, "|p" "1": paused
-- KEYS[4]  ZSET  redisson_delay_queue_timeout:{N}        member -> due time (epoch ms)
-- KEYS[5]  LIST  redisson_delay_queue:{N}                backup list
-- KEYS[6]  HASH  redisson_delay_queue_msgs:{N}           message id -> sort key .. payload
-- KEYS[7]  CHANNEL redisson_delay_queue_channel:{N}      a new earliest due time
-- KEYS[8]  LIST  <ns>:<queue>                            ready queue
-- KEYS[9]  HASH  <ns>:<queue>.msgs                       redis message id -> encoded message
-- KEYS[10] ZSET  redisson_delay_queue_idle:{N}           idle consumers (see _wake.lua)
--
-- ARGV[1] the operation, ARGV[2] the schedule's name, then per operation:
--
-- "start": (re)start the chain at a tick, replacing the scheduled tick if there is one,
--          only if a guard holds: ARGV[3] its kind, ARGV[4] the expected value:
--            "def": the stored definition is ARGV[4] ("": there is none);
--            "stall": "|s" is ARGV[4] (the chain waits to be resumed from that tick);
--            "paused": the schedule is paused (ARGV[4] unused).
--          ARGV[5] the definition to store ("": unchanged), ARGV[6] the member of the
--          tick to schedule ("": none, the schedule stays paused), ARGV[7] its payload
--          (sort key .. data), ARGV[8] its due time (epoch ms), ARGV[9] the ticks after it,
--          ARGV[10..] pairs of redis message id and encoded message pushed to the ready
--          queue now (missed ticks that run, by the catch-up policy).
--          Clears "|s" and, unless ARGV[6] is "", "|p"; ticks run now update "|r" and "|l"
--          (the latest of them). Returns 1, or 0 when the guard
--          failed (nothing written: another worker changed it first).
-- "extend": append the ticks ARGV[4] (comma-separated) to "|t" if its last tick is ARGV[3]
--          ("": the list is empty) and the chain is scheduled. Returns 1, or 0.
-- "pause": unschedule the chain's tick, mark paused. Returns 1, or 0 if it was paused.
-- "remove": unschedule the chain's tick and forget the schedule. Returns 1, or 0 if unknown.
-- "sweep": every schedule at once (ARGV[2] unused; see the code).
-- "check": read the schedule; a chain whose tick is no longer scheduled (cancelled or
--          cleared by an operator) while neither paused nor waiting is marked waiting
--          from the tick after the last run (ARGV[3]: the server time in ms, used when
--          none ran). Returns {definition or false, "|s" or "", "|p" or "", "|t" or "",
--          chain member or ""}.
--
-- Reads and checks come before the first write: a key of the wrong type, a due time that
-- is not a number or an unknown operation fails the call with nothing written.

-- include: _member.lua
-- include: _wake.lua

local schedules, chains, state, zset, backup, payloads = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local channel, ready, ready_msgs, idle = KEYS[7], KEYS[8], KEYS[9], KEYS[10]
local op, name = ARGV[1], ARGV[2]

-- A chain whose tick is no longer scheduled (cancelled or cleared by an operator) while
-- neither paused nor waiting is marked waiting from the tick after its last run (now_ms
-- when none ran). Returns the tick it now waits at, or nil ("check" and "sweep").
local function mark_broken(each, member, waiting, paused, last_run, now_ms)
    if paused or waiting or (member and redis.call("ZSCORE", zset, member)) then
        return nil
    end
    local from = last_run and string.format("%d", tonumber(last_run) + 1) or now_ms
    redis.call("HDEL", chains, each)
    redis.call("HSET", state, each .. "|s", from)
    return from
end

if op == "sweep" then
    -- Every schedule of the queue in one call (a consumer's maintenance): those whose
    -- chain waits to be resumed, whose tick is no longer scheduled (then marked waiting, as
    -- "check" does; ARGV[3] the server time in ms) or that have fewer than ARGV[4]
    -- upcoming times. Returns their names.
    local found = {}
    local all = redis.call("HGETALL", schedules)
    for i = 1, #all, 2 do
        local each = all[i]
        local got = redis.call("HMGET", state, each .. "|s", each .. "|p", each .. "|t", each .. "|r")
        if not got[2] then
            local member = redis.call("HGET", chains, each)
            local times = 0
            for _ in string.gmatch(got[3] or "", "%d+") do
                times = times + 1
            end
            if mark_broken(each, member, got[1], got[2], got[4], ARGV[3]) or got[1] or times < tonumber(ARGV[4]) then
                found[#found + 1] = each
            end
        end
    end
    return found
end

local definition = redis.call("HGET", schedules, name)
local chained = redis.call("HGET", chains, name)
local flags = redis.call("HMGET", state, name .. "|s", name .. "|p", name .. "|t", name .. "|r")
local stalled, paused, upcoming, last_run = flags[1], flags[2], flags[3], flags[4]

-- The scheduled tick leaves the ZSET and the payload hash (its backup-list entry is
-- trimmed by transfer.lua's upkeep like any cancelled member's).
local function unchain()
    if chained then
        redis.call("ZREM", zset, chained)
        redis.call("HDEL", payloads, message_id_of(chained))
        redis.call("HDEL", chains, name)
    end
end

if op == "check" then
    local from = definition and mark_broken(name, chained, stalled, paused, last_run, ARGV[3])
    if from then
        stalled, chained = from, false
    end
    return {definition or false, stalled or "", paused or "", upcoming or "", chained or ""}
end

if op == "start" then
    local kind, expected = ARGV[3], ARGV[4]
    local holds
    if kind == "def" then
        holds = (definition or "") == expected
    elseif kind == "stall" then
        holds = stalled == expected
    else
        holds = paused == "1"
    end
    if not holds then
        return 0
    end
    local member, payload, due = ARGV[6], ARGV[7], ARGV[8]
    if member ~= "" and not tonumber(due) then
        return redis.error_reply("ERR schedule: the due time must be a number of ms, not " .. tostring(due))
    end
    local head = redis.call("ZRANGE", zset, 0, 0, "WITHSCORES")
    redis.call("LLEN", backup) -- type checks: the writes below must not fail halfway
    redis.call("HLEN", payloads)
    redis.call("LLEN", ready)
    redis.call("HLEN", ready_msgs)
    redis.call("ZCARD", idle)
    unchain()
    if ARGV[5] ~= "" then
        redis.call("HSET", schedules, name, ARGV[5])
    end
    redis.call("HDEL", state, name .. "|s")
    if member ~= "" then
        redis.call("HDEL", state, name .. "|p")
        redis.call("ZADD", zset, due, member)
        redis.call("RPUSH", backup, member)
        redis.call("HSET", payloads, message_id_of(member), payload)
        redis.call("HSET", chains, name, member)
        redis.call("HSET", state, name .. "|t", ARGV[9])
        if not head[2] or tonumber(due) < tonumber(head[2]) then
            redis.call("PUBLISH", channel, due)
        end
    end
    if #ARGV >= 11 then
        local ids, pairs_ = {}, {}
        for i = 10, #ARGV, 2 do
            ids[#ids + 1] = ARGV[i]
            pairs_[#pairs_ + 1] = ARGV[i]
            pairs_[#pairs_ + 1] = ARGV[i + 1]
        end
        redis.call("RPUSH", ready, unpack(ids)) -- the plain lane (a fetch through lanes takes it in turn)
        redis.call("HSET", ready_msgs, unpack(pairs_))
        wake(idle, channel .. ":wake:{", #ids)
        -- The latest of them is the schedule's last run, as transfer.lua records a tick's.
        local last = tonumber(string.match(ids[#ids], ":(%d+)$"))
        if last then
            local t = redis.call("TIME")
            local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
            redis.call("HSET", state, name .. "|r", string.format("%d", last), name .. "|l", now_ms - last)
        end
    end
    return 1
end

if op == "extend" then
    local last = string.match(upcoming or "", "(%d+)$") or ""
    if not chained or last ~= ARGV[3] then
        return 0
    end
    local joined = ARGV[4]
    if upcoming and upcoming ~= "" then
        joined = upcoming .. "," .. ARGV[4]
    end
    redis.call("HSET", state, name .. "|t", joined)
    return 1
end

if op == "pause" then
    if paused or not definition then
        return 0
    end
    redis.call("ZCARD", zset) -- type checks before the first write
    redis.call("HLEN", payloads)
    unchain()
    redis.call("HDEL", state, name .. "|s")
    redis.call("HSET", state, name .. "|p", "1")
    return 1
end

if op == "remove" then
    if not definition then
        return 0
    end
    redis.call("ZCARD", zset)
    redis.call("HLEN", payloads)
    unchain()
    redis.call("HDEL", schedules, name)
    redis.call("HDEL", state, name .. "|t", name .. "|r", name .. "|l", name .. "|s", name .. "|p")
    return 1
end

return redis.error_reply("ERR schedule: unknown operation " .. tostring(op))
