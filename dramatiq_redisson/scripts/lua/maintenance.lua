-- maintenance: recover the unacked messages of dead workers and expire old dead letters.
--
-- KEYS[1]  ready           LIST  <ns>:<queue>  ready queue
-- KEYS[2]  ready_msgs      HASH  <ns>:<queue>.msgs
-- KEYS[3]  xq              ZSET  <ns>:<queue>.XQ  dead letter id -> time of death (epoch ms)
-- KEYS[4]  xq_msgs         HASH  <ns>:<queue>.XQ.msgs
-- KEYS[5]  legacy_dq       LIST  <ns>:<queue>.DQ  the built-in broker's delay queue
-- KEYS[6]  legacy_dq_msgs  HASH  <ns>:<queue>.DQ.msgs
-- KEYS[7]  fetched         HASH  redisson_delay_queue_fetched:{N}  fetch records (the ids put back lose theirs)
-- KEYS[8]  flow            HASH  redisson_delay_queue_flow:{N}  the flow keys (see flow_context.lua)
-- KEYS[9]  levels          ZSET  redisson_delay_queue_levels:{N}
-- KEYS[10] lane_of         HASH  redisson_delay_queue_lane_of:{N}
-- KEYS[11..] acks,legacy_dq_acks  SETs, a pair per dead worker: <ns>:__acks__.<id>.<queue>,
--          <ns>:__acks__.<id>.<queue>.DQ
--          (unacked messages go back to the queue they were fetched from; the .DQ
--          ones are then migrated to the delayed queue by the consumer)
--
-- ARGV[1]  dead_message_ttl_ms  dead-letter time to live in ms
-- ARGV[2]  expire_limit  most dead letters to expire in this call
-- ARGV[3]  lane_prefix  the lanes' key prefix (from _keys.py)
-- ARGV[4]  ring_prefix  the rings' key prefix
--
-- Lanes: while the queue's flow is on, each id of the ready queue goes back to the head of
-- the lane its fetch record names (the ready queue when it names none), and the concurrency
-- slots its record says it uses are given back (flow_context.lua).
--
-- Memory: every growing write (LPUSH) follows a DEL of the ack set it empties, and
-- expiry only deletes, so maintenance runs on a server at its maxmemory limit.
--
-- Returns: {messages requeued, dead letters expired}
-- returns: {requeued, expired}

-- include: variadic.lua
-- include: flow_context.lua
-- include: flow_on.lua
-- include: flow_lib.lua

local ready, ready_msgs, xq, xq_msgs = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local t = redis.call("TIME")
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local flow = flow_context(ready, KEYS[8], KEYS[9], KEYS[10], ARGV[3], ARGV[4])
local laned = flow_on(flow)
local requeued = 0
local function recover(acks, list, msgs)
    local ids = redis.call("SMEMBERS", acks)
    redis.call("DEL", acks)
    local by_lane = laned and list == ready
    local records = {}
    if #ids > 0 and list == ready then
        if by_lane then
            records = redis.call("HMGET", KEYS[7], unpack(ids))
        end
        variadic("HDEL", KEYS[7], ids)
    end
    local back, back_records = {}, {}
    for i = 1, #ids do
        if redis.call("HEXISTS", msgs, ids[i]) == 1 then
            if by_lane then
                back[#back + 1] = ids[i]
                back_records[#back] = records[i]
            else
                redis.call("LPUSH", list, ids[i])
            end
            requeued = requeued + 1
        end
    end
    if by_lane then
        flow_lib().put_back(flow, back, back_records)
        flow_lib().release(flow, records) -- the concurrency slots they used (consumers poll: no wake-up here)
    end
end
for k = 11, #KEYS, 2 do
    recover(KEYS[k], ready, ready_msgs)
    recover(KEYS[k + 1], KEYS[5], KEYS[6])
end

local expired = redis.call("ZRANGEBYSCORE", xq, "-inf", now_ms - tonumber(ARGV[1]), "LIMIT", 0, tonumber(ARGV[2]))
if #expired > 0 then
    redis.call("ZREM", xq, unpack(expired))
    redis.call("HDEL", xq_msgs, unpack(expired))
    redis.call("HDEL", flow.lane_of, unpack(expired)) -- a dead letter's lane record
end
return {requeued, #expired}
