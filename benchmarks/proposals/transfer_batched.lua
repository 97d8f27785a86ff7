-- PROPOSAL (not used by the package): dramatiq_redisson/lua/transfer.lua with the same
-- KEYS, ARGV, semantics and reply, but with one server command per BATCH instead of
-- about seven per moved entry. Profiling (benchmarks/profile_transfer.py) shows the
-- current script's time is almost all per-entry redis.call overhead:
--   per moved entry: HGET payload, HDEL payload, HSET ready_msgs, RPUSH ready, and in the
--   trim loop LINDEX + ZSCORE + LPOP of the backup list's head.
-- Here: HMGET once, HSET/RPUSH/HDEL once each (variadic), and the trim reads the head of
-- the backup list with one LRANGE, checks it with one ZMSCORE and drops the dead prefix
-- with one LTRIM. The compaction pass likewise uses ZMSCORE + one RPUSH.
-- Variadic calls are chunked so that unpack() stays far below Lua's stack limit.

local zset, backup, payloads, compact, cursor_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local ready, ready_msgs, xq, xq_msgs = KEYS[6], KEYS[7], KEYS[8], KEYS[9]
local limit = tonumber(ARGV[1])
local trim_budget = tonumber(ARGV[2])
local compact_step = tonumber(ARGV[3])
local slack = tonumber(ARGV[4])
local CHUNK = 1000

local function variadic(cmd, key, items)
    for i = 1, #items, CHUNK do
        redis.call(cmd, key, unpack(items, i, math.min(#items, i + CHUNK - 1)))
    end
end

local t = redis.call("TIME")
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local moved, dead = 0, 0
local due = redis.call("ZRANGEBYSCORE", zset, "-inf", now_ms, "LIMIT", 0, limit)
if #due > 0 then
    local ids = {}
    for i = 1, #due do
        ids[i] = string.sub(due[i], 17)
    end
    local stored = {}
    for i = 1, #ids, CHUNK do
        local part = redis.call("HMGET", payloads, unpack(ids, i, math.min(#ids, i + CHUNK - 1)))
        for j = 1, #part do
            stored[i + j - 1] = part[j]
        end
    end
    local pairs_, members, gone, xq_pairs, xq_msg_pairs = {}, {}, {}, {}, {}
    for i = 1, #due do
        local member, data = due[i], stored[i]
        if #member > 16 and data and string.sub(data, 1, 16) == string.sub(member, 1, 16) then
            pairs_[#pairs_ + 1] = member
            pairs_[#pairs_ + 1] = string.sub(data, 17)
            members[#members + 1] = member
            gone[#gone + 1] = ids[i]
            moved = moved + 1
        else
            xq_pairs[#xq_pairs + 1] = now_ms
            xq_pairs[#xq_pairs + 1] = member
            xq_msg_pairs[#xq_msg_pairs + 1] = member
            xq_msg_pairs[#xq_msg_pairs + 1] = data or member
            dead = dead + 1
        end
    end
    if moved > 0 then
        variadic("HSET", ready_msgs, pairs_)
        variadic("RPUSH", ready, members)
        variadic("HDEL", payloads, gone)
    end
    if dead > 0 then
        variadic("ZADD", xq, xq_pairs)
        variadic("HSET", xq_msgs, xq_msg_pairs)
    end
    variadic("ZREM", zset, due)
end

local function live(entries)
    local scores = {}
    for i = 1, #entries, CHUNK do
        local part = redis.call("ZMSCORE", zset, unpack(entries, i, math.min(#entries, i + CHUNK - 1)))
        for j = 1, #part do
            scores[i + j - 1] = part[j]
        end
    end
    return scores
end

local cursor = redis.call("GET", cursor_key)
if cursor then
    cursor = tonumber(cursor)
    local entries = redis.call("LRANGE", backup, cursor, cursor + compact_step - 1)
    if #entries > 0 then
        local scores = live(entries)
        local keep = {}
        for i = 1, #entries do
            if scores[i] then
                keep[#keep + 1] = entries[i]
            end
        end
        if #keep > 0 then
            variadic("RPUSH", compact, keep)
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
    local heads = redis.call("LRANGE", backup, 0, trim_budget - 1)
    if #heads > 0 then
        local scores = live(heads)
        local dead_prefix = 0
        while dead_prefix < #heads and not scores[dead_prefix + 1] do
            dead_prefix = dead_prefix + 1
        end
        if dead_prefix > 0 then
            redis.call("LTRIM", backup, dead_prefix, -1)
        end
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
