-- peek: one scheduled message and its due time, read together.
--
-- KEYS[1]  ZSET  redisson_delay_queue_timeout:{N}   member -> due time (epoch ms)
-- KEYS[2]  HASH  redisson_delay_queue_msgs:{N}      message id -> sort key .. encoded message
--
-- ARGV[1]  message id
--
-- Returns: {due time in epoch ms, stored payload (sort key .. encoded message)}, or
--          {-1, false} when the message is not scheduled (moved, cancelled, unknown).

local stored = redis.call("HGET", KEYS[2], ARGV[1])
if not stored then
    return {-1, false}
end
local due = redis.call("ZSCORE", KEYS[1], string.sub(stored, 1, 16) .. ARGV[1])
if not due then
    return {-1, false}
end
return {tonumber(due), stored}
