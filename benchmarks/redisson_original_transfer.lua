-- Reference implementation of Redisson's ORIGINAL RDelayedQueue transfer logic,
-- written for the benchmarks from its published description (it is not Redisson's
-- source): ZRANGEBYSCORE due entries LIMIT 100; for every entry RPUSH it to the
-- target list and LREM it from the backup list; ZREM the batch; return the new head.
--
-- The LREM scans the backup list from its head until it finds the entry, so moving
-- one message costs O(entries offered before it that are still in the list): with
-- far-future entries offered first, every moved message scans the whole backlog.
--
-- Two modes, chosen by the number of keys:
--
--   Pure (what Redisson does; used by the "backlog cost" scenario, no workers):
--     KEYS[1]  LIST  target queue
--     KEYS[2]  ZSET  redisson_delay_queue_timeout:{N}   member -> due ms
--     KEYS[3]  LIST  redisson_delay_queue:{N}           backup list, offer order
--
--   Broker (the "redisson-lrem" broker variant: RedissonBroker's key layout, with
--   the payload moved along so that a real Dramatiq worker can run the message):
--     KEYS[4]  HASH  redisson_delay_queue_msgs:{N}      message id -> sort key .. data
--     KEYS[5]  HASH  <ns>:<queue>.msgs                  ready-queue payloads
--     ARGV[2]  the queue's name as a JSON string (a compact payload is written back
--              as the JSON message, as transfer.lua does: the broker's _body.lua)
--
-- ARGV[1]  most entries to move (Redisson uses 100)
--
-- "now" is the server's TIME (Redisson passes the client's clock; on one host the
-- two are the same clock).
--
-- Returns: {moved, next due ms or -1, server now ms, 0}  (the shape of transfer.lua's reply)

-- include: _body.lua

local target, zset, backup = KEYS[1], KEYS[2], KEYS[3]
local payloads, ready_msgs = KEYS[4], KEYS[5]
local limit = tonumber(ARGV[1])

local t = redis.call("TIME")
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local due = redis.call("ZRANGEBYSCORE", zset, 0, now_ms, "LIMIT", 0, limit)
for i = 1, #due do
    local member = due[i]
    if payloads then
        local message_id = message_id_of(member)
        local stored = redis.call("HGET", payloads, message_id)
        if stored then
            redis.call("HSET", ready_msgs, member, ready_body(member, string.sub(stored, key_len(stored) + 1), ARGV[2]))
            redis.call("HDEL", payloads, message_id)
        end
    end
    redis.call("RPUSH", target, member)
    redis.call("LREM", backup, 1, member)
end
if #due > 0 then
    redis.call("ZREM", zset, unpack(due))
end

local next_due = -1
local head = redis.call("ZRANGE", zset, 0, 0, "WITHSCORES")
if head[1] then
    next_due = tonumber(head[2])
end
return {#due, next_due, now_ms, 0}
