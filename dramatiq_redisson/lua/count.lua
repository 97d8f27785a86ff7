-- count: how many messages are scheduled, in all or due before a time, on the server clock.
--
-- KEYS[1]  ZSET  redisson_delay_queue_timeout:{N}   member -> due time (epoch ms)
--
-- ARGV[1]  "all", "before" (due before ARGV[2], epoch ms, exclusive) or "overdue" (due
--          before the server's now minus ARGV[2] ms: they should have moved already)
-- ARGV[2]  milliseconds (integer)
--
-- Returns: {count, server time in epoch ms}.

local zset, mode, value = KEYS[1], ARGV[1], tonumber(ARGV[2])
local t = redis.call("TIME")
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if mode == "all" then
    return {redis.call("ZCARD", zset), now_ms}
elseif mode == "before" then
    return {redis.call("ZCOUNT", zset, "-inf", "(" .. value), now_ms}
elseif mode == "overdue" then
    return {redis.call("ZCOUNT", zset, "-inf", "(" .. (now_ms - value)), now_ms}
end
return redis.error_reply("count: unknown mode " .. tostring(mode))
