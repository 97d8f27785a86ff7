-- fetch: take up to N messages off a ready queue into this worker's ack set.
--
-- KEYS[1]  ready          LIST   <ns>:<queue>  ready queue (redis message ids)
-- KEYS[2]  ready_msgs     HASH   <ns>:<queue>.msgs  redis message id -> encoded message
-- KEYS[3]  acks           SET    <ns>:__acks__.<worker id>.<queue>  fetched, not yet acked
-- KEYS[4]  heartbeats     ZSET   <ns>:__heartbeats__  worker id -> last seen (epoch ms)
-- KEYS[5]  idle           ZSET   redisson_delay_queue_idle:{N}  consumer token -> messages it can start now
-- KEYS[6]  paused         STRING redisson_delay_queue_paused:{N}  set while the queue is paused
-- KEYS[7]  fetched        HASH   redisson_delay_queue_fetched:{N}  redis message id -> fetch record
-- KEYS[8]  flow +lanes    HASH   redisson_delay_queue_flow:{N}  optional (with the other +lanes
--          keys and ARGV[7..8]): the lanes' counts, limits and slots (flow_context.lua); whether
--          the queue's messages go through lanes is its flag, the STRING ARGV[7] .. "on}",
--          read with the pause in one MGET
-- KEYS[9]  levels +lanes  ZSET   redisson_delay_queue_levels:{N}  priorities with lanes in their ring
-- KEYS[10] lane_of +lanes HASH   redisson_delay_queue_lane_of:{N}  message id -> lane (scheduled ones)
--
-- ARGV[1]  count  most messages to take: what the consumer can start now (its idle worker
--          threads, within its free prefetch)
-- ARGV[2]  worker_id  worker id
-- ARGV[3]  token  the consumer's token, or "": a consumer that listens on its wake channel
--          gives its token, and is listed in the idle registry with what it can start
--          still, ARGV[1] minus what came (enqueue and transfer wake the consumer that can
--          start the most, see wake.lua); 0 when every slot was filled: it is woken by
--          nobody until an ack raises its score (ack.lua).
-- ARGV[4]  beat  "0": leave the heartbeat alone (this process beat less than a heartbeat
--          interval ago); else write it (ZREM + ZADD, server clock)
-- ARGV[5]  fetcher  "<worker id>|<consumer token>": who fetches, recorded with the fetch time
--          (server clock) of each message in KEYS[7], for operators ("running now");
--          the ack deletes the record
-- ARGV[6]  clock?  optional: the caller's estimate of the server clock (epoch ms, see ack.lua),
--          for the beat and the fetch records instead of a TIME call; "" or absent: TIME
-- ARGV[7]  lane_prefix +lanes  with KEYS[8..10]: the lanes' key prefix (from _keys.py)
-- ARGV[8]  ring_prefix +lanes  the rings' key prefix
-- ARGV[9]  rate_prefix +lanes  the rate logs' key prefix
-- ARGV[10] wake_prefix +lanes  the wake channels' prefix (see wake.lua)
--
-- Lanes: when KEYS[8] exists, ids are taken by priority and in turn over the groups
-- (flow_take, include/flow_take.lua) instead of from the head of the ready queue, within the queue's
-- concurrency limits (a group at its limit waits off its ring). Each message taken uses a
-- concurrency slot of its queue and of its group: its fetch record ends with "|held" (the
-- marker's stored name, see fetch_record.lua) and, for an id
-- not in the plain lane, "|lane:<lane>" (a requeue puts it back there); the ack, nack,
-- requeue and the liveness requeues give the slots back. Within the queue's rate limits
-- (server clock): a fetch takes no more than the queue's rate allows now, and a group
-- over its rate waits off its ring until it may start again. The consumer that comes up
-- short is told how long to sleep ("wait:<ms>", below) if no other one sleeps for an
-- earlier start already; when it fetches then and more could start, it wakes as many
-- idle consumers as that needs (wake.lua): one sleeps, not the whole fleet.
--
-- Paused (KEYS[6] exists): nothing is taken and the consumer leaves the idle registry
-- (enqueues do not wake it; it polls until the queue is resumed).
--
-- Memory (see scripts/README.md): the first write is the ZREM of the heartbeat, or the
-- LPOP: a full server keeps handing out work, and the acks that follow free memory.
--
-- Returns: a flat list id1, data1, id2, data2, ...; data is false when the id had
--          no message (it is then dropped from the ack set too); or false (nil) when the
--          queue is paused. Through lanes, one more element may end the list: its
--          words "slots" (the messages use concurrency slots, their acks and nacks give
--          them back, see ack.lua) and "wait:<ms>" (a rate limit keeps
--          messages back: this consumer fetches again in that many ms, a wake-up aside). Without lanes, "more": it
--          took ARGV[1] messages and more are ready.

-- include: wake.lua
-- include: flow_context.lua
-- include: flow_lib.lua

local ready, ready_msgs, acks, heartbeats = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local idle, paused, fetched = KEYS[5], KEYS[6], KEYS[7]
local count, worker_id, token = tonumber(ARGV[1]), ARGV[2], ARGV[3]

local function server_ms()
    local estimate = tonumber(ARGV[6] or "")
    if estimate then
        return estimate
    end
    local t = redis.call("TIME")
    return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local now_ms = nil -- read only when needed: an idle poll takes nothing and writes no beat
if ARGV[4] ~= "0" then
    now_ms = server_ms()
    redis.call("ZREM", heartbeats, worker_id)
    redis.call("ZADD", heartbeats, now_ms, worker_id)
end
-- The pause and the flow's flag (_keys.flow_flag) in one read (an older ACL rule without
-- MGET: one GET each, see scripts/README.md). The flow's context is made only when the
-- flag is set.
local flag = KEYS[8] and (ARGV[7] .. "on}")
local state
if flag then
    state = redis.pcall("MGET", paused, flag)
    if state.err then
        state = { redis.call("EXISTS", paused) == 1, redis.call("EXISTS", flag) == 1 }
    end
else
    state = { redis.call("EXISTS", paused) == 1, false }
end
if state[1] then -- paused (MGET gives false for a missing key)
    if token ~= "" then
        redis.call("ZREM", idle, token)
    end
    return false
end
local ids, lanes, flow, wait_ms = nil, nil, nil, nil
if state[2] then
    flow = flow_context(ready, KEYS[8], KEYS[9], KEYS[10], ARGV[7], ARGV[8], ARGV[9])
    local wake_slots
    ids, lanes, wait_ms, wake_slots = flow_lib().take(flow, count, token)
    if wake_slots > 0 and ARGV[10] then
        if token ~= "" then
            redis.call("ZREM", idle, token) -- (registered again below if it came up short)
        end
        wake(idle, ARGV[10], wake_slots)
    end
    if #ids == 0 then
        ids = false
    end
else
    ids = redis.call("LPOP", ready, count)
end
if token ~= "" then
    -- Listed with what it can start still (0: listening, every thread busy; see wake.lua).
    redis.call("ZADD", idle, count - (ids and #ids or 0), token)
end
local status = wait_ms and ("wait:" .. wait_ms) or nil
if not flow and ids and #ids == count and redis.call("LLEN", ready) > 0 then
    -- Took all it asked for and more wait (every thread of the fleet is busy): the caller
    -- may fill its prefetch (issue 46).
    status = "more"
end
if not ids then
    return status and { status } or {}
end
local data = redis.call("HMGET", ready_msgs, unpack(ids))
local result = {}
local held = {}
for i = 1, #ids do
    result[#result + 1] = ids[i]
    result[#result + 1] = data[i]
    if data[i] then
        held[#held + 1] = ids[i]
    end
end
if #held > 0 then
    redis.call("SADD", acks, unpack(held))
    local record, pairs = (now_ms or server_ms()) .. "|" .. ARGV[5], {}
    local lane_at = {}
    if lanes then
        for i = 1, #ids do
            lane_at[ids[i]] = lanes[i]
        end
    end
    local slot_lanes = {} -- the lanes whose concurrency slots the messages use
    for i = 1, #held do
        pairs[2 * i - 1] = held[i]
        if lanes then
            slot_lanes[i] = lane_at[held[i]]
            pairs[2 * i] = flow_lib().record(record, slot_lanes[i])
        else
            pairs[2 * i] = record
        end
    end
    redis.call("HSET", fetched, unpack(pairs))
    if lanes then
        flow_lib().use_slots(flow, slot_lanes)
        status = status and ("slots " .. status) or "slots" -- the ack gives the slots back (ack.lua)
    end
end
if status then
    result[#result + 1] = status
end
return result
