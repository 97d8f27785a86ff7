-- cancel: remove scheduled messages by message id, or by dedupe key, atomically.
--
-- KEYS[1]  timeout_zset  ZSET  redisson_delay_queue_timeout:{N}   member -> due time (epoch ms)
-- KEYS[2]  payloads      HASH  redisson_delay_queue_msgs:{N}      message id -> sort key .. encoded message
-- KEYS[3]  dedupe        HASH  redisson_delay_queue_dedupe:{N}    dedupe key -> scheduled message id
-- KEYS[4]  keyed         HASH  redisson_delay_queue_keyed:{N}     message id -> "<ttl ms>:<dedupe key>"
-- KEYS[5]  lane_of +lane HASH  redisson_delay_queue_lane_of:{N}   optional: message id -> lane; a cancelled
--                                                   message's record goes with it
--
-- ARGV[1]  by  "id": ARGV[2..] are message ids; "key": ARGV[2..] are dedupe keys (the
--          messages that hold them are cancelled)
-- ARGV[2..] names  message ids or dedupe keys
--
-- The backup list keeps the member; transfer trims or compacts it away later. A
-- cancelled message's dedupe key is released (a throttle window only starts once a
-- message moved, so none is touched).
--
-- Returns: the number of scheduled messages removed.

-- include: stored_key.lua
-- include: variadic.lua
-- include: unkey.lua

local zset, payloads, dedupe, keyed = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local by_key = ARGV[1] == "key"
if not by_key and ARGV[1] ~= "id" then
    return redis.error_reply("cancel: unknown mode " .. tostring(ARGV[1]))
end
local removed = {}
for i = 2, #ARGV do
    local message_id = ARGV[i]
    if by_key then
        message_id = redis.call("HGET", dedupe, ARGV[i])
    end
    local stored = message_id and redis.call("HGET", payloads, message_id)
    if stored then
        redis.call("ZREM", zset, stored_key(stored) .. message_id)
        redis.call("HDEL", payloads, message_id)
        removed[#removed + 1] = message_id
    end
end
unkey(keyed, dedupe, removed)
if KEYS[5] and #removed > 0 then
    variadic("HDEL", KEYS[5], removed)
end
return #removed
