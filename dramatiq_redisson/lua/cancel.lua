-- cancel: remove scheduled messages by message id, atomically.
--
-- KEYS[1]  ZSET  redisson_delay_queue_timeout:{N}   member -> due time (epoch ms)
-- KEYS[2]  HASH  redisson_delay_queue_msgs:{N}      message id -> sort key .. encoded message
--
-- ARGV[1..] message ids
--
-- The backup list keeps the member; transfer trims or compacts it away later.
--
-- Returns: the number of scheduled messages removed.

local zset, payloads = KEYS[1], KEYS[2]
local removed = 0
for i = 1, #ARGV do
    local message_id = ARGV[i]
    local stored = redis.call("HGET", payloads, message_id)
    if stored then
        redis.call("ZREM", zset, string.sub(stored, 1, 16) .. message_id)
        redis.call("HDEL", payloads, message_id)
        removed = removed + 1
    end
end
return removed
