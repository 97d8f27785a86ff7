-- enqueue: put messages on a ready queue, each redis message id at most once, and wake
-- idle consumers when the queue was empty.
--
-- KEYS[1]  ready           LIST     <ns>:<queue>  ready queue (redis message ids)
-- KEYS[2]  ready_msgs      HASH     <ns>:<queue>.msgs  redis message id -> encoded message
-- KEYS[3]  channel         CHANNEL  redisson_delay_queue_channel:{N}
-- KEYS[4]  sent            ZSET     redisson_delay_queue_sent:{N}  redis message id -> enqueue time (epoch ms)
-- KEYS[5]  idle            ZSET     redisson_delay_queue_idle:{N}  consumer token -> messages it can start now
-- KEYS[6]  flow +lanes     HASH     redisson_delay_queue_flow:{N}
-- KEYS[7]  levels +lanes   ZSET     redisson_delay_queue_levels:{N}
-- KEYS[8]  lane_of +lanes  HASH     redisson_delay_queue_lane_of:{N}
--                   optional, the +lanes keys: the flow keys (see flow_context.lua). With
--                   them, ARGV[4] and ARGV[5] are the lanes' and the rings' key prefixes
--                   and the messages come in triples from ARGV[6]: id, encoded message,
--                   lane ("" or "0:": the ready queue). A lane other than "0:" turns the
--                   queue's flow on and sends the call's ids through their lanes; plain
--                   ids alone go onto the ready queue as without lanes.
--
-- ARGV[1]  window_ms  dedupe window in ms (0: only the check against KEYS[2])
-- ARGV[2]  in_flight  "" or, for the retry of a message in flight on a full server, the redis
--          message id of its in-flight copy: that copy's payload is dropped first, so
--          the retry takes its place (see Memory)
-- ARGV[3]  clock  the caller's estimate of the server clock (epoch ms: a TIME this script
--          returned, or a transfer's, and the caller's monotonic clock since), or "":
--          TIME is read (only with a window). One command less per call.
-- ARGV[4]  lane_prefix +lanes  the lanes' key prefix (with the +lanes keys, above)
-- ARGV[5]  ring_prefix +lanes  the rings' key prefix
-- ARGV[6..] entries  repeated pairs: redis message id, encoded message (from ARGV[4]
--          without +lanes); with +lanes, triples: id, encoded message, lane
--
-- An id is skipped (a duplicate) when it is already in KEYS[2] (queued or in flight),
-- when KEYS[4] recorded it within the window (the first copy may already be acked),
-- or when it came earlier in the same call. So a call that runs twice (a client retry
-- after a lost reply, a producer sending the same message again) enqueues it once.
-- A record's score is compared with the window, so KEYS[4] need not be trimmed on every
-- call: it is on about one in TRIM_EVERY (by the clock's millisecond) and on the transfer's
-- upkeep ticks, and it expires after a window of quiet.
--
-- Memory (see scripts/README.md): the first write is the HSETNX of the first fresh
-- payload: on a full server the whole call is refused with OOM and writes nothing. A key of the wrong type fails the call with nothing written too (see below). A call
-- whose ids are all duplicates writes nothing. With ARGV[2] the first write is the HDEL
-- of the in-flight copy (when it is still there), so the retry goes through on a full
-- server; the worker's ack finds nothing more to delete, and a requeue of that id after
-- a crash finds no payload and drops it. The record costs about 107 bytes per id within
-- the window (measured with 36-character ids; see the broker's dedupe_window).
--
-- Wake-ups: idle consumers (those whose last fetch came up short) are woken on their own
-- wake channels until what they can start covers the ids pushed (see wake.lua), so one
-- message wakes one consumer, not the whole fleet. Without idle consumers it costs one
-- ZRANGE.
--
-- Returns: {length of the ready queue afterwards, ids pushed by this call, the server
--          clock this call read with TIME (epoch ms), or 0 when it read none}.
-- returns: {length, pushed, clock_ms}

-- include: variadic.lua
-- include: wake.lua
-- include: record_lane.lua
-- include: flow_context.lua
-- include: flow_lib.lua

local ready, ready_msgs, channel, sent, idle = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local window = tonumber(ARGV[1])
local in_flight = ARGV[2]

local flow, first, step = nil, 4, 2 -- flow: the flow keys were given (the context is made for a laned id)
if KEYS[6] then
    flow, first, step = true, 6, 3
end

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

-- Reads first: ZSCORE (with a window) type-checks KEYS[4]. The first write is the HSETNX
-- of the first fresh id's payload, which also tells an id already in KEYS[2] (queued or in
-- flight) from a new one: one command for the HEXISTS and HSET of the previous release.
-- A KEYS[2] of the wrong type, or a full server, fails that first HSETNX with nothing
-- written; a KEYS[1] of the wrong type fails the RPUSH after it, and the payloads this
-- call wrote are taken back (pcall), so nothing stays. An older ACL rule without HSETNX
-- gets HEXISTS, RPUSH, HSET (scripts/README.md). So does a call with ARGV[2], whose HDEL
-- of the in-flight copy must come before anything that grows memory.
local pairs_, ids, recorded = {}, {}, {}
local seen = {}
local checked = in_flight ~= "" -- HEXISTS now, HSET after the RPUSH (the previous release's way)
local lane_of_id, laned = {}, false
for i = first, #ARGV, step do
    local id = ARGV[i]
    if flow and ARGV[i + 2] ~= "" and ARGV[i + 2] ~= PLAIN_LANE then
        lane_of_id[id] = ARGV[i + 2]
    end
    if not seen[id] then
        seen[id] = true
        local fresh = true
        if window > 0 then
            local at = redis.call("ZSCORE", sent, id)
            if at and tonumber(at) >= now_ms - window then
                fresh = false
            end
        end
        if fresh and not checked then
            local added = redis.pcall("HSETNX", ready_msgs, id, ARGV[i + 1])
            if type(added) == "table" then
                if string.find(added.err, "OOM", 1, true) or string.find(added.err, "WRONGTYPE", 1, true) then
                    return redis.error_reply(added.err) -- the first write: nothing written
                end
                checked = true -- refused (a user on the rule before HSETNX): none was written
            else
                fresh = added == 1
            end
        end
        if fresh and checked then
            fresh = redis.call("HEXISTS", ready_msgs, id) == 0
            if fresh then
                pairs_[#pairs_ + 1] = id
                pairs_[#pairs_ + 1] = ARGV[i + 1]
            end
        end
        if fresh then
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
-- The ids pushed, recorded for the dedupe window (trimmed on one call in TRIM_EVERY).
local function record_sent()
    if window > 0 then
        if now_ms % TRIM_EVERY == 0 then
            redis.call("ZREMRANGEBYSCORE", sent, "-inf", string.format("(%d", now_ms - window))
        end
        variadic("ZADD", sent, recorded)
        redis.call("PEXPIRE", sent, window)
    end
end

if flow then
    for i = 1, #ids do
        laned = laned or lane_of_id[ids[i]] ~= nil
    end
    if laned then
        redis.call("LLEN", ready) -- type check before the first write of the flow path
        flow = flow_context(ready, KEYS[6], KEYS[7], KEYS[8], ARGV[4], ARGV[5])
        flow_lib().enable(flow.flag)
    end
end
if laned then
    -- Plain ids alone go the plain way below, even while the flow is on: the fetch takes
    -- the ready list in turn as the plain lane (flow_context.lua), so a plain send pays nothing.
    local lanes = {}
    for i = 1, #ids do
        lanes[i] = lane_of_id[ids[i]] or PLAIN_LANE
    end
    flow_lib().push(flow, ids, lanes, false)
    if checked then
        variadic("HSET", ready_msgs, pairs_)
    end
    record_sent()
    wake(idle, channel .. ":wake:{", #ids)
    return {redis.call("LLEN", ready), #ids, read_ms}
end
local length = 0
for i = 1, #ids, CHUNK do
    local pushed = redis.pcall("RPUSH", ready, unpack(ids, i, math.min(#ids, i + CHUNK - 1)))
    if type(pushed) == "table" then
        -- A ready list of the wrong type (only the first chunk can fail): take the
        -- payloads back. (With `checked`, nothing was written but ARGV[2]'s HDEL, after
        -- the same type check.)
        if not checked then
            variadic("HDEL", ready_msgs, ids)
        end
        return redis.error_reply(pushed.err)
    end
    length = pushed
end
if checked then
    variadic("HSET", ready_msgs, pairs_)
end
record_sent()
wake(idle, channel .. ":wake:{", #ids)
return {length, #ids, read_ms}
