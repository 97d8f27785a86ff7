-- transfer: move due entries from a queue's ZSET into its ready queue, atomically,
-- and keep the backup list free of entries that are no longer scheduled.
--
-- KEYS[1]  ZSET  redisson_delay_queue_timeout:{N}   member -> due time (epoch ms)
-- KEYS[2]  LIST  redisson_delay_queue:{N}           backup list, offer order
-- KEYS[3]  HASH  redisson_delay_queue_msgs:{N}      message id -> sort key .. encoded message
-- KEYS[4]  LIST  redisson_delay_queue_compact:{N}   backup list being rebuilt by a compaction pass
-- KEYS[5]  STRING redisson_delay_queue_cursor:{N}   read position of the compaction pass
-- KEYS[6]  LIST  <ns>:<queue>           ready queue (redis message ids)
-- KEYS[7]  HASH  <ns>:<queue>.msgs      redis message id -> encoded message
-- KEYS[8]  ZSET  <ns>:<queue>.XQ        dead letters, scored by time of death (epoch ms)
-- KEYS[9]  HASH  <ns>:<queue>.XQ.msgs   dead letter id -> data
--
-- ARGV[1]  most entries to move in this call
-- ARGV[2]  most dead entries to pop from the head of the backup list
-- ARGV[3]  backup-list entries a compaction pass examines in this call
-- ARGV[4]  slack: a pass starts when LLEN(backup) > 2 * ZCARD + slack
--
-- The member of an entry is its 16-char sort key followed by the message id; the
-- member is also the redis message id the entry gets in the ready queue.
--
-- Returns: {moved, next due time in epoch ms or -1, server time in epoch ms,
--           entries sent to the dead letters}

local zset, backup, payloads, compact, cursor_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local ready, ready_msgs, xq, xq_msgs = KEYS[6], KEYS[7], KEYS[8], KEYS[9]
local limit = tonumber(ARGV[1])
local trim_budget = tonumber(ARGV[2])
local compact_step = tonumber(ARGV[3])
local slack = tonumber(ARGV[4])

local t = redis.call("TIME")
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local moved, dead = 0, 0
local due = redis.call("ZRANGEBYSCORE", zset, "-inf", now_ms, "LIMIT", 0, limit)
for i = 1, #due do
    local member = due[i]
    local message_id = string.sub(member, 17)
    local stored = nil
    if #member > 16 then
        stored = redis.call("HGET", payloads, message_id)
    end
    if stored and string.sub(stored, 1, 16) == string.sub(member, 1, 16) then
        redis.call("HDEL", payloads, message_id)
        redis.call("HSET", ready_msgs, member, string.sub(stored, 17))
        redis.call("RPUSH", ready, member)
        moved = moved + 1
    else
        -- A member without its payload cannot be delivered: keep what there
        -- is for inspection instead of dropping it silently.
        redis.call("ZADD", xq, now_ms, member)
        redis.call("HSET", xq_msgs, member, stored or member)
        dead = dead + 1
    end
end
if #due > 0 then
    redis.call("ZREM", zset, unpack(due))
end

local cursor = redis.call("GET", cursor_key)
if cursor then
    -- A compaction pass is running: copy live entries, in order, to the new list.
    cursor = tonumber(cursor)
    local entries = redis.call("LRANGE", backup, cursor, cursor + compact_step - 1)
    for i = 1, #entries do
        if redis.call("ZSCORE", zset, entries[i]) then
            redis.call("RPUSH", compact, entries[i])
        end
    end
    cursor = cursor + #entries
    if cursor >= redis.call("LLEN", backup) then
        redis.call("UNLINK", backup)
        if redis.call("EXISTS", compact) == 1 then
            redis.call("RENAME", compact, backup)
        end
        redis.call("DEL", cursor_key)
    else
        redis.call("SET", cursor_key, cursor)
    end
else
    -- Entries leave the backup list from its head once they are no longer scheduled.
    for _ = 1, trim_budget do
        local head = redis.call("LINDEX", backup, 0)
        if not head or redis.call("ZSCORE", zset, head) then
            break
        end
        redis.call("LPOP", backup)
    end
    if redis.call("LLEN", backup) > 2 * redis.call("ZCARD", zset) + slack then
        redis.call("DEL", compact)
        redis.call("SET", cursor_key, 0)
    end
end

local next_due = -1
local head = redis.call("ZRANGE", zset, 0, 0, "WITHSCORES")
if head[1] then
    next_due = tonumber(head[2])
end
return {moved, next_due, now_ms, dead}
