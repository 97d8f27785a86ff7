-- limits: set, clear or read a queue's concurrency and rate limits, or set its group
-- weights (flow control).
--
-- KEYS[1]  flow   HASH  redisson_delay_queue_flow:{N}     the limits, slots in use and blocked lanes
-- KEYS[2]  ready  LIST  <ns>:<queue>                      ready queue (the plain lane)
-- KEYS[3]  levels ZSET  redisson_delay_queue_levels:{N}   priorities with lanes in their ring
-- KEYS[4]  idle   ZSET  redisson_delay_queue_idle:{N}     consumer token -> messages it can start now
--
-- ARGV[1]  op  "set", "update", "clear", "get" or "weights"
-- ARGV[2]  concurrency  with "set", the queue's concurrency limit, "" for none; with
--          "update" (ARGV[2..6]), "" keeps the limit as it is and -1 removes it
-- ARGV[3]  group_concurrency  each group's concurrency limit
-- ARGV[4]  rate  the queue's rate
-- ARGV[5]  per_ms  the rate window (ms)
-- ARGV[6]  group_rate  each group's rate
-- ARGV[7]  lane_prefix  the lanes' key prefix
-- ARGV[8]  ring_prefix  the rings' key prefix
-- ARGV[9]  wake_prefix  the wake channels' prefix
-- ARGV[10] rate_prefix  the rate logs' key prefix (the queue's start log is ARGV[10] ..
--          "q}", the lanes waiting for their group's rate ARGV[10] .. "deferred}"; see
--          flow_context.lua)
-- ARGV[11..] weights  with "weights": pairs of a group (as hex) and its weight (an int > 1)
--
-- "set" turns the queue's flow on (its messages go through lanes from now on; the ready
-- list's ids join ring 0) and writes the limits given ("" removes one). "clear" removes
-- them all and leaves the flow on. Either way every lane waiting for its group's slot or
-- rate goes back on its ring and every idle consumer is woken, so a raised or removed
-- limit takes effect at once; a lowered one takes effect at the next fetches (running
-- messages finish; starts already in a window count against a lowered rate). Values are
-- checked by the caller (positive ints, a rate with its window); this script writes what
-- it is given. "get" writes nothing. "weights" turns the flow on and makes the group
-- weights exactly those given (a group not given: weight 1); turns under way start over.
-- "update" is "set" of the limits as they are with those given changed; it writes nothing
-- and fails if the result would have a rate without its window, or a window without a rate.
--
-- Returns: {queue limit or -1, group limit or -1, slots in use, groups with slots in use,
--           lanes waiting for their group's slot (before this call, for "set"/"update"/"clear"),
--           queue rate or -1, window ms or -1, group rate or -1, the queue's starts in the
--           current window (-1 without a queue rate), lanes waiting for their group's rate}

-- include: wake.lua
-- include: flow_context.lua
-- include: flow_lib.lua

local flow = flow_context(KEYS[2], KEYS[1], KEYS[3], nil, ARGV[7], ARGV[8], ARGV[10])
local op = ARGV[1]
if op ~= "set" and op ~= "update" and op ~= "clear" and op ~= "get" and op ~= "weights" then
    return redis.error_reply("ERR limits: unknown operation " .. tostring(op))
end
local FIELDS = { "concurrency", "group_concurrency", "rate", "per_ms", "group_rate" }
local blocked = tonumber(redis.call("HGET", KEYS[1], "blocked") or 0)
local values = { ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6] }
if op == "update" then
    local had = redis.call("HMGET", KEYS[1], unpack(FIELDS))
    for i = 1, 5 do
        if values[i] == "" then
            values[i] = had[i] or ""
        elseif values[i] == "-1" then
            values[i] = ""
        end
    end
    if (values[3] ~= "" or values[5] ~= "") ~= (values[4] ~= "") then
        return redis.error_reply("ERR limits: a rate needs its window (per_ms), and a window a rate")
    end
end
if op == "set" or op == "update" then
    flow_lib().enable(flow.flag)
    for i, field in ipairs(FIELDS) do
        if values[i] == "" then
            redis.call("HDEL", KEYS[1], field)
        else
            redis.call("HSET", KEYS[1], field, values[i])
        end
    end
elseif op == "clear" then
    redis.call("HDEL", KEYS[1], unpack(FIELDS))
elseif op == "weights" then
    flow_lib().enable(flow.flag)
    local old = {}
    for _, field in ipairs(redis.call("HKEYS", KEYS[1])) do
        if string.match(field, "^w%x+$") or string.match(field, "^c%d+:%x*$") then
            old[#old + 1] = field
        end
    end
    for i = 1, #old, 1000 do
        redis.call("HDEL", KEYS[1], unpack(old, i, math.min(#old, i + 999)))
    end
    local count = 0
    for i = 11, #ARGV, 2 do
        redis.call("HSET", KEYS[1], "w" .. ARGV[i], ARGV[i + 1])
        count = count + 1
    end
    if count > 0 then
        redis.call("HSET", KEYS[1], "weights", count)
    else
        redis.call("HDEL", KEYS[1], "weights")
    end
end
if op == "set" or op == "update" or op == "clear" then
    flow_lib().unblock_all(flow)
    wake(KEYS[4], ARGV[9], redis.call("ZCARD", KEYS[4]) * 1000000)
end
local now = redis.call("HMGET", KEYS[1], "concurrency", "group_concurrency", "inuse", "groups",
    "rate", "per_ms", "group_rate", "blocked")
local started = -1
local rate, per_ms = tonumber(now[5]), tonumber(now[6])
if rate and per_ms then
    local t = redis.call("TIME")
    local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    started = flow_lib().live_starts(flow.rate_prefix .. "q}", now_ms - per_ms)
end
return {
    tonumber(now[1]) or -1,
    tonumber(now[2]) or -1,
    tonumber(now[3]) or 0,
    tonumber(now[4]) or 0,
    op == "get" and tonumber(now[8] or 0) or blocked,
    rate or -1,
    per_ms or -1,
    tonumber(now[7]) or -1,
    started,
    redis.call("ZCARD", flow.deferred),
}
