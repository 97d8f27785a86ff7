-- _dedupe.lua: functions included by offer.lua, transfer.lua, cancel.lua and bulk.lua
-- (see _script_runner.py), not a script of its own. They keep a queue's dedupe-key index
-- exact while messages leave the schedule, and its throttle windows bounded.
--
-- The index (see _keys.py):
--   dedupe  HASH  redisson_delay_queue_dedupe:{N}  dedupe key -> message id (scheduled)
--   keyed   HASH  redisson_delay_queue_keyed:{N}   message id -> "<ttl ms>:<dedupe key>"
--   holds   ZSET  redisson_delay_queue_holds:{N}   dedupe key -> end of its throttle
--                                                   window (epoch ms, server clock)
--   held    HASH  redisson_delay_queue_held:{N}    dedupe key -> the encoded message
--                                                   that ran (returned to dropped sends)
-- Invariants: dedupe[k] = id exactly when keyed[id] = "<ttl>:k" and id is scheduled;
-- a key is in at most one of dedupe and holds.

-- include: _chunked.lua

-- Ended throttle windows one call trims at most (bounded work). transfer.lua trims each
-- time it adds windows, so ended ones never outnumber what one call trims by much, and
-- both keys expire with the latest window, which removes whatever is left.
local HOLD_TRIM = 16

-- "<ttl>:<key>" -> ttl (number), key
local function dedupe_split(value)
    local colon = string.find(value, ":", 1, true)
    return tonumber(string.sub(value, 1, colon - 1)), string.sub(value, colon + 1)
end

-- unkey(keyed, dedupe, ids): the message ids leave the schedule (moved, cancelled,
-- removed, rescheduled without their key): their entries leave both hashes. A key whose
-- index entry names another message (it cannot, but never drop someone else's) stays.
-- Returns, by position in ids, {ttl, key} for each id that had a key. O(#ids); one
-- EXISTS when the queue has no keyed message.
local function unkey(keyed, dedupe, ids)
    local found = {}
    if #ids == 0 or redis.call("EXISTS", keyed) == 0 then
        return found
    end
    local values = gather("HMGET", keyed, ids)
    local gone_ids, gone_keys = {}, {}
    for i = 1, #ids do
        if values[i] then
            local ttl, key = dedupe_split(values[i])
            found[i] = { ttl, key }
            gone_ids[#gone_ids + 1] = ids[i]
            gone_keys[#gone_keys + 1] = key
        end
    end
    if #gone_ids > 0 then
        gather("HDEL", keyed, gone_ids)
        local owners = gather("HMGET", dedupe, gone_keys)
        local drop = {}
        for j = 1, #gone_keys do
            if owners[j] == gone_ids[j] then
                drop[#drop + 1] = gone_keys[j]
            end
        end
        if #drop > 0 then
            gather("HDEL", dedupe, drop)
        end
    end
    return found
end

-- trim_holds(holds, held, now_ms): drop up to HOLD_TRIM throttle windows that ended.
local function trim_holds(holds, held, now_ms)
    local ended = redis.call("ZRANGEBYSCORE", holds, "-inf", now_ms, "LIMIT", 0, HOLD_TRIM)
    if #ended > 0 then
        redis.call("ZREM", holds, unpack(ended))
        redis.call("HDEL", held, unpack(ended))
    end
end

-- expire_holds(holds, held, now_ms): both keys expire when their latest window ends, so
-- windows nobody touches again never outlive it.
local function expire_holds(holds, held, now_ms)
    local last = redis.call("ZRANGE", holds, -1, -1, "WITHSCORES")
    if last[1] then
        local left = math.max(1, tonumber(last[2]) - now_ms)
        redis.call("PEXPIRE", holds, left)
        redis.call("PEXPIRE", held, left)
    end
end
