-- enqueue: put messages on a ready queue, each redis message id at most once, and wake
-- idle consumers when the queue was empty.
--
-- KEYS[1]  LIST     <ns>:<queue>        ready queue (redis message ids)
-- KEYS[2]  HASH     <ns>:<queue>.msgs   redis message id -> encoded message
-- KEYS[3]  CHANNEL  redisson_delay_queue_channel:{N}
-- KEYS[4]  ZSET     redisson_delay_queue_sent:{N}   redis message id -> enqueue time (epoch ms)
-- KEYS[5]  ZSET     redisson_delay_queue_idle:{N}   consumer token -> free slots (idle consumers)
--
-- ARGV[1]   dedupe window in ms (0: only the check against KEYS[2])
-- ARGV[2]   "" or, for the retry of a message in flight on a full server, the redis
--           message id of its in-flight copy: that copy's payload is dropped first, so
--           the retry takes its place (see Memory)
-- ARGV[3]   the caller's estimate of the server clock (epoch ms: a TIME this script
--           returned, or a transfer's, and the caller's monotonic clock since), or "":
--           TIME is read (only with a window). One command less per call.
-- ARGV[4..] repeated pairs: redis message id, encoded message
--
-- An id is skipped (a duplicate) when it is already in KEYS[2] (queued or in flight),
-- when KEYS[4] recorded it within the window (the first copy may already be acked),
-- or when it came earlier in the same call. So a call that runs twice (a client retry
-- after a lost reply, a producer sending the same message again) enqueues it once.
-- A record's score is compared with the window, so KEYS[4] need not be trimmed on every
-- call: it is on about one in TRIM_EVERY (by the clock's millisecond) and on the transfer's
-- upkeep ticks, and it expires after a window of quiet.
--
-- Memory: the first write is the RPUSH, which may grow memory: on a server at its
-- maxmemory limit (noeviction) the whole call is refused with OOM and writes nothing.
-- (Redis checks maxmemory only before a script's first write.) Every other key is read
-- (type-checked) before it, so a key of the wrong type fails the call before anything
-- is written too. A call whose ids are all duplicates writes nothing. With ARGV[2] the
-- first write is the HDEL of the in-flight copy (when it is still there), so the retry
-- goes through on a full server; the worker's ack finds nothing more to delete, and a
-- requeue of that id after a crash finds no payload and drops it. The record costs
-- about 107 bytes per id within the window (measured with 36-character ids; see the
-- broker's dedupe_window).
--
-- Wake-ups: idle consumers (those whose last fetch came up short) are woken on their own
-- wake channels until their free slots cover the ids pushed (see _wake.lua), so one
-- message wakes one consumer, not the whole fleet. Without idle consumers it costs one
-- ZRANGE.
--
-- Returns: {length of the ready queue afterwards, ids pushed by this call, the server
--          clock this call read with TIME (epoch ms), or 0 when it read none}.

-- include: _wake.lua

local ready, ready_msgs, channel, sent, idle = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local window = tonumber(ARGV[1])
local in_flight = ARGV[2]

-- include: _chunked.lua

local TRIM_EVERY = 8
local now_ms, read_ms = 0, 0
if window > 0 then
    now_ms = tonumber(ARGV[3])
    if not now_ms then
        local t = redis.call("TIME")
        now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
        read_ms = now_ms
    end
end

-- Reads: HEXISTS type-checks KEYS[2] and ZSCORE KEYS[4]; the first write, RPUSH,
-- type-checks KEYS[1]. A key of the wrong type fails the call before anything is written.
local pairs_, ids, recorded = {}, {}, {}
local seen = {}
for i = 4, #ARGV, 2 do
    local id = ARGV[i]
    if not seen[id] then
        seen[id] = true
        local fresh = redis.call("HEXISTS", ready_msgs, id) == 0
        if fresh and window > 0 then
            local at = redis.call("ZSCORE", sent, id)
            if at and tonumber(at) >= now_ms - window then
                fresh = false
            end
        end
        if fresh then
            pairs_[#pairs_ + 1] = id
            pairs_[#pairs_ + 1] = ARGV[i + 1]
            ids[#ids + 1] = id
            recorded[#recorded + 1] = now_ms
            recorded[#recorded + 1] = id
        end
    end
end
if #ids == 0 then
    return {redis.call("LLEN", ready), 0, read_ms}
end

if in_flight ~= "" and redis.call("HEXISTS", ready_msgs, in_flight) == 1 then
    redis.call("LLEN", ready) -- type check: the HDEL below becomes the first write
    redis.call("HDEL", ready_msgs, in_flight)
end
local length = 0
for i = 1, #ids, CHUNK do
    length = redis.call("RPUSH", ready, unpack(ids, i, math.min(#ids, i + CHUNK - 1)))
end
variadic("HSET", ready_msgs, pairs_)
if window > 0 then
    if now_ms % TRIM_EVERY == 0 then
        redis.call("ZREMRANGEBYSCORE", sent, "-inf", string.format("(%d", now_ms - window))
    end
    variadic("ZADD", sent, recorded)
    redis.call("PEXPIRE", sent, window)
end
wake(idle, channel .. ":wake:{", #ids)
return {length, #ids, read_ms}
