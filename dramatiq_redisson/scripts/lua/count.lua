-- count: how many messages are scheduled, in all or due before a time, on the server clock.
--
-- KEYS[1]  timeout_zset ZSET  redisson_delay_queue_timeout:{N}   member -> due time (epoch ms)
--
-- ARGV[1]  mode  "all", "before" (due before ARGV[2], epoch ms, exclusive) or "overdue" (due
--          before the server's now minus ARGV[2] ms: they should have moved already)
-- ARGV[2]  value_ms  milliseconds (integer)
--
-- Returns: the count.

local zset, mode, value = KEYS[1], ARGV[1], tonumber(ARGV[2])
if mode == "all" then
    return redis.call("ZCARD", zset)
elseif mode == "before" then
    return redis.call("ZCOUNT", zset, "-inf", "(" .. value)
elseif mode == "overdue" then
    local t = redis.call("TIME")
    local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    return redis.call("ZCOUNT", zset, "-inf", "(" .. (now_ms - value))
end
return redis.error_reply("count: unknown mode " .. tostring(mode))
