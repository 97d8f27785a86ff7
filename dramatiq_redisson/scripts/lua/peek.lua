-- peek: one scheduled message and its due time, read together.
--
-- KEYS[1]  timeout_zset ZSET  redisson_delay_queue_timeout:{N}   member -> due time (epoch ms)
-- KEYS[2]  payloads     HASH  redisson_delay_queue_msgs:{N}      message id -> sort key .. encoded message
-- KEYS[3]  dedupe       HASH  redisson_delay_queue_dedupe:{N}    dedupe key -> scheduled message id
--                                                    (read with ARGV[2] "key" only)
--
-- ARGV[1]  name  message id, or with ARGV[2] "key" a dedupe key
-- ARGV[2]  by?  "id" (or absent): ARGV[1] is a message id; "key": the message holding it
--
-- Returns: {due time in epoch ms, stored payload (sort key .. encoded message), message
--          id}, or {-1, false, false} when the message is not scheduled (moved,
--          cancelled, unknown; no message holds the key).
-- returns: {due, stored, found}

-- include: stored_key.lua

local message_id = ARGV[1]
if ARGV[2] == "key" then
    message_id = redis.call("HGET", KEYS[3], ARGV[1])
    if not message_id then
        return {-1, false, false}
    end
end
local stored = redis.call("HGET", KEYS[2], message_id)
if not stored then
    return {-1, false, false}
end
local due = redis.call("ZSCORE", KEYS[1], stored_key(stored) .. message_id)
if not due then
    return {-1, false, false}
end
return {tonumber(due), stored, message_id}
