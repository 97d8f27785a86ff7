-- stats: one queue's counts, read together on the server clock.
--
-- KEYS[1]  ready         LIST  <ns>:<queue>           ready queue
-- KEYS[2]  ready_msgs    HASH  <ns>:<queue>.msgs      data of ready and in-flight messages
-- KEYS[3]  timeout_zset  ZSET  redisson_delay_queue_timeout:{N}   member -> due time (epoch ms)
-- KEYS[4]  xq            ZSET  <ns>:<queue>.XQ        dead letters
-- KEYS[5]  lease         STRING redisson_delay_queue_lease:{N}     "<token> <expiry ms>"
-- KEYS[6]  consumers     ZSET  redisson_delay_queue_consumers:{N}  consumer token -> last seen (epoch ms)
-- KEYS[7]  legacy_dq     LIST  <ns>:<queue>.DQ        the built-in broker's delay queue (not yet migrated)
-- KEYS[8]  paused        STRING redisson_delay_queue_paused:{N}    since when the queue is paused
-- KEYS[9]  sent          ZSET  redisson_delay_queue_sent:{N}      redis message id -> when it became ready
--                                 (epoch ms, server clock: enqueue.lua and transfer.lua record it
--                                 within the dedupe window)
-- KEYS[10] counts        HASH   redisson_delay_queue_counts:{N}    rare events' counters ("unknown_actor")
-- KEYS[11] flow +lanes   HASH   redisson_delay_queue_flow:{N}      optional, with KEYS[12]: lanes (flow_context.lua)
-- KEYS[12] levels +lanes ZSET   redisson_delay_queue_levels:{N}    the priorities with waiting lanes
--
-- ARGV[1]  grace_ms  overdue grace (ms): entries due more than this long ago count as overdue
-- ARGV[2]  live_ms  consumers seen within this many ms count as live
-- ARGV[3]  ring_prefix +lanes  with KEYS[11..]: the ring prefix (a priority's ring is
--          ARGV[3] .. priority .. "}")
-- ARGV[4]  rate_prefix +lanes  the rate logs' (the lanes waiting for their group's rate are the ZSET
--          ARGV[4] .. "deferred}")
-- ARGV[5]  lane_prefix +lanes  the lanes' key prefix (a lane's list is ARGV[5] .. lane .. "}")
--
-- Latency (issue 58): how long the oldest ready message has waited, on the server clock,
-- the signal autoscalers read. The ready list is FIFO (ids pushed at its tail, fetched from
-- its head), so its head is its oldest; with lanes, the head of each lane in each ring too,
-- up to LATENCY_LANES lanes in all. A head's wait is from when it became ready (its record
-- in KEYS[9]); a head without one (older than the dedupe window, or no window) is timed
-- from when its producer sent it (its producer's clock: a delayed message's sort key, an
-- immediate one's message_timestamp): for a delayed message that counts its delay too, so
-- past the window the latency is an upper bound. A handful of commands, whatever the
-- number of messages.
--
-- Unknown actors (issue 58): the messages put back because the worker that got them had
-- not declared their actor (KEYS[10]'s "unknown_actor", counted by that worker), one HGET.
--
-- Cost: O(log n), a fixed number of commands; with lanes, one more per priority that has
-- lanes in its ring (at most max_priority + 1) and a read of 256 counters, whatever the
-- number of groups.
--
-- Returns: {server now (epoch ms), ready, ready + in flight (messages with data in the
--           ready queue's hash), scheduled, overdue, earliest due time or -1, dead,
--           lease holder's token or "", live consumers, built-in delay-queue length,
--           since when the queue is paused (epoch ms; 0: unknown) or -1 if it is not,
--           the latency (ms; 0 when nothing is ready), the messages put back for an unknown
--           actor, then, while the queue uses lanes: the lanes waiting off their rings for
--           their group's slot or rate, the lanes in the rings (the plain lane not counted),
--           and for each priority with ids
--           waiting in its lanes but the plain one: priority, that count}
--           (the plain lane is in ring 0 when the ready list holds ids)

-- include: key_ms.lua

local LATENCY_LANES = 64

local t = redis.call("TIME")
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local grace, live = tonumber(ARGV[1]), tonumber(ARGV[2])
local head = redis.call("ZRANGE", KEYS[3], 0, 0, "WITHSCORES")
local holder = redis.call("GET", KEYS[5])
local paused = redis.call("GET", KEYS[8])
local reply = {
    now_ms,
    redis.call("LLEN", KEYS[1]),
    redis.call("HLEN", KEYS[2]),
    redis.call("ZCARD", KEYS[3]),
    redis.call("ZCOUNT", KEYS[3], "-inf", "(" .. (now_ms - grace)),
    head[2] and tonumber(head[2]) or -1,
    redis.call("ZCARD", KEYS[4]),
    holder and string.match(holder, "^(.*) %d+$") or "",
    redis.call("ZCOUNT", KEYS[6], now_ms - live, "+inf"),
    redis.call("LLEN", KEYS[7]),
    paused and (tonumber(paused) or 0) or -1,
}

-- When the id at the head of a list became ready (see Latency), or nil for an empty list.
local function ready_since(list)
    local id = redis.call("LINDEX", list, 0)
    if not id then
        return nil
    end
    local since = tonumber(redis.call("ZSCORE", KEYS[9], id))
    if since then
        return since
    end
    local first = string.byte(id, 1)
    if first and first >= 103 and first <= 118 and #id > 14 then -- a delayed one's sort key
        return key_ms(id)
    end
    -- An immediate message (its id is its message id): the time it was sent.
    local sent_ms = string.match(redis.call("HGET", KEYS[2], id) or "", '"message_timestamp":(%d+)')
    return tonumber(sent_ms) or now_ms -- (a message of another encoder: not timed)
end

local oldest = ready_since(KEYS[1])
local laned = KEYS[11] and redis.call("EXISTS", KEYS[11]) == 1
if laned and ARGV[5] then
    local looked = 0
    for _, priority in ipairs(redis.call("ZRANGE", KEYS[12], 0, -1)) do
        for _, lane in ipairs(redis.call("LRANGE", ARGV[3] .. priority .. "}", 0, LATENCY_LANES - looked - 1)) do
            if lane ~= "0:" then -- (the plain lane is the ready list, timed above)
                local since = ready_since(ARGV[5] .. lane .. "}")
                if since and (not oldest or since < oldest) then
                    oldest = since
                end
            end
            looked = looked + 1
        end
        if looked >= LATENCY_LANES then
            break
        end
    end
end
reply[#reply + 1] = oldest and math.max(0, now_ms - oldest) or 0
reply[#reply + 1] = tonumber(redis.call("HGET", KEYS[10], "unknown_actor") or 0)

if laned then
    local off_ring = tonumber(redis.call("HGET", KEYS[11], "blocked") or 0)
    if ARGV[4] then
        off_ring = off_ring + redis.call("ZCARD", ARGV[4] .. "deferred}")
    end
    reply[#reply + 1] = off_ring
    local lanes = redis.call("HEXISTS", KEYS[11], "plain") == 1 and -1 or 0 -- the plain lane is none
    for _, priority in ipairs(redis.call("ZRANGE", KEYS[12], 0, -1)) do
        lanes = lanes + redis.call("LLEN", ARGV[3] .. priority .. "}")
    end
    reply[#reply + 1] = math.max(0, lanes)
    -- Every priority's count in one read: a lane off its ring for its group's limit is in no
    -- ring, so `levels` does not name every priority with waiting ids.
    local fields = {}
    for priority = 0, 255 do
        fields[#fields + 1] = "p" .. priority
    end
    local counts = redis.call("HMGET", KEYS[11], unpack(fields))
    for i = 1, #counts do
        local n = tonumber(counts[i] or 0)
        if n and n > 0 then
            reply[#reply + 1] = i - 1
            reply[#reply + 1] = n
        end
    end
end
return reply
