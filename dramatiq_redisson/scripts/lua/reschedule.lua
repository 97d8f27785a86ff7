-- reschedule: give one scheduled message a new due time, atomically, on the server clock.
--
-- KEYS[1]  timeout_zset ZSET    redisson_delay_queue_timeout:{N}   member -> due time (epoch ms)
-- KEYS[2]  payloads     HASH    redisson_delay_queue_msgs:{N}      message id -> sort key .. encoded message
-- KEYS[3]  channel      CHANNEL redisson_delay_queue_channel:{N}   receives the due time of a new earliest entry
--
-- ARGV[1]  message_id
-- ARGV[2]  mode  "in": due ARGV[3] ms from the server's now; "at": due at ARGV[3] (epoch ms;
--          a time in the past means now)
-- ARGV[3]  value_ms  milliseconds (integer)
--
-- The member (sort key + message id) stays the same, so the message keeps its id, its
-- place in the backup list and its place among equal due times. When the message becomes
-- the earliest entry its due time is announced, so the transfer lease holder moves it on
-- time ("at" now: at once, which is how a message is promoted).
--
-- Memory: the first write is a ZREM (never grows memory), so this runs on a full server.
--
-- Returns: the new due time (epoch ms), or -1 when the message is not scheduled.

-- include: stored_key.lua

local zset, payloads, channel = KEYS[1], KEYS[2], KEYS[3]
local message_id, mode, value = ARGV[1], ARGV[2], tonumber(ARGV[3])

local stored = redis.call("HGET", payloads, message_id)
if not stored then
    return -1
end
local member = stored_key(stored) .. message_id
if not redis.call("ZSCORE", zset, member) then
    return -1
end
local t = redis.call("TIME")
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local due
if mode == "at" then
    due = math.max(value, now_ms)
elseif mode == "in" then
    due = now_ms + value
else
    return redis.error_reply("reschedule: unknown mode " .. tostring(mode))
end
redis.call("ZREM", zset, member)
redis.call("ZADD", zset, due, member)
local head = redis.call("ZRANGE", zset, 0, 0)
if head[1] == member then
    redis.call("PUBLISH", channel, due)
end
return due
