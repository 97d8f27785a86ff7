-- limits: set, or clear, a queue's concurrency limits (flow control), atomically.
--
-- KEYS[1]  HASH  redisson_delay_queue_flow:{N}     the limits, slots in use and blocked lanes
-- KEYS[2]  LIST  <ns>:<queue>                      ready queue (the plain lane)
-- KEYS[3]  ZSET  redisson_delay_queue_levels:{N}   priorities with lanes in their ring
-- KEYS[4]  ZSET  redisson_delay_queue_idle:{N}     consumer token -> free slots
--
-- ARGV[1]  "set" or "clear"
-- ARGV[2]  with "set": the queue's concurrency limit, or "" for none
-- ARGV[3]  with "set": each group's concurrency limit, or "" for none
-- ARGV[4]  the lanes' key prefix, ARGV[5] the rings', ARGV[6] the wake channels'
--
-- "set" turns the queue's flow on (its messages go through lanes from now on; the ready
-- list's ids join ring 0) and writes both limits ("" removes one). "clear" removes both
-- and leaves the flow on. Either way every lane waiting for its group's slot goes back on
-- its ring and every idle consumer is woken, so a raised or removed limit takes effect at
-- once; a lowered one takes effect at the next fetches (running messages finish). Values
-- are checked by the caller (positive ints); this script writes what it is given.
--
-- Returns: {queue limit or -1, group limit or -1, slots in use, groups with slots in use,
--           lanes waiting for their group's slot (before this call)}

-- include: _wake.lua
-- include: _flow.lua

local flow = flow_context(KEYS[2], KEYS[1], KEYS[3], nil, ARGV[4], ARGV[5])
local op = ARGV[1]
if op ~= "set" and op ~= "clear" then
    return redis.error_reply("ERR limits: unknown operation " .. tostring(op))
end
local blocked = tonumber(redis.call("HGET", KEYS[1], "blocked") or 0)
if op == "set" then
    flow_lib().enable(flow)
    for i, field in ipairs({ "concurrency", "group_concurrency" }) do
        if ARGV[i + 1] == "" then
            redis.call("HDEL", KEYS[1], field)
        else
            redis.call("HSET", KEYS[1], field, ARGV[i + 1])
        end
    end
else
    redis.call("HDEL", KEYS[1], "concurrency", "group_concurrency")
end
flow_lib().unblock_all(flow)
wake(KEYS[4], ARGV[6], redis.call("ZCARD", KEYS[4]) * 1000000)
local now = redis.call("HMGET", KEYS[1], "concurrency", "group_concurrency", "inuse", "groups")
return {
    tonumber(now[1]) or -1,
    tonumber(now[2]) or -1,
    tonumber(now[3]) or 0,
    tonumber(now[4]) or 0,
    blocked,
}
