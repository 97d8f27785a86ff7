-- _chain.lua: periodic chaining, functions included by transfer.lua (see _script_runner.py
-- and schedule.lua), not a script of its own.
--
-- A schedule has one tick scheduled at any time: its chained tick (message id
-- "periodic:<name>:<tick ms>", named by the chains HASH). When that tick moves, the next
-- one is scheduled in the same step: the first time in "<name>|t" (schedule state)
-- after it, with the same payload but the new time as its timestamp. A tick that moves
-- late (more than c.grace ms, or after the next tick's time too: every worker was down)
-- is not run: the chain stops, "|s" records the tick, and the caller resumes it by the
-- schedule's catch-up policy (_periodic.py); so does a chain that ran out of times. Both,
-- and a chain with fewer than c.low_water times left, are named in c.attend.
--
-- c: {chains, state (the schedule state HASH), zset, backup, payloads, now_ms, grace,
--     low_water, writes = {}, attend = {}}
-- chain_step(c, member, body, due_ms): reads only (the caller's first write comes
--   later); queues the writes in c.writes. Returns whether the message runs (false: a
--   missed tick, its payload to drop); true as well for a member that is not its
--   schedule's chained tick (an ordinary message: a retry of a tick, a tick run by hand).
-- chain_write(c, step): the writes of one step, after the caller's first write.

local function chain_step(c, member, body, due_ms)
    local name = string.match(message_id_of(member), "^periodic:(.+):%d+$")
    if not name or redis.call("HGET", c.chains, name) ~= member then
        return true
    end
    local times = {}
    for time in string.gmatch(redis.call("HGET", c.state, name .. "|t") or "", "%d+") do
        if tonumber(time) > due_ms then
            times[#times + 1] = tonumber(time)
        end
    end
    local following = times[1]
    local run = c.now_ms - due_ms <= c.grace and not (following and following <= c.now_ms)
    c.writes[#c.writes + 1] = {name = name, run = run, due_ms = due_ms, body = body, times = times}
    if not run or not following or #times - 1 < c.low_water then
        c.attend[#c.attend + 1] = name
    end
    return run
end

local function chain_write(c, step)
    local name, run, due_ms, body, times = step.name, step.run, step.due_ms, step.body, step.times
    local following = times[1]
    if not run then
        redis.call("HDEL", c.chains, name)
        redis.call("HSET", c.state, name .. "|s", string.format("%d", due_ms))
        return
    end
    redis.call("HSET", c.state, name .. "|r", string.format("%d", due_ms), name .. "|l", c.now_ms - due_ms)
    if not following then
        redis.call("HDEL", c.chains, name)
        redis.call("HSET", c.state, name .. "|s", string.format("%d", due_ms + 1))
        return
    end
    local at = string.format("%d", following)
    local message_id = "periodic:" .. name .. ":" .. at
    local next_member = key_at(following) .. message_id
    redis.call("ZADD", c.zset, at, next_member)
    redis.call("RPUSH", c.backup, next_member)
    -- The same payload, the new time as its timestamp (the last field: see _body.lua).
    redis.call("HSET", c.payloads, message_id, key_at(following) .. string.match(body, "^(.*\30)") .. at)
    redis.call("HSET", c.chains, name, next_member)
    redis.call("HSET", c.state, name .. "|t", table.concat(times, ",", 2))
end
