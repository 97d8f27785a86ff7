-- nack: move a fetched message to the queue's dead letters, and count it in the history.
--
-- KEYS[1]  acks          SET    <ns>:__acks__.<worker id>.<queue>
-- KEYS[2]  ready_msgs    HASH   <ns>:<queue>.msgs
-- KEYS[3]  xq            ZSET   <ns>:<queue>.XQ  dead letter id -> time of death (epoch ms)
-- KEYS[4]  xq_msgs       HASH   <ns>:<queue>.XQ.msgs  dead letter id -> encoded message
-- KEYS[5]  heartbeats    ZSET   <ns>:__heartbeats__
-- KEYS[6]  fetched       HASH   redisson_delay_queue_fetched:{N}  redis message id -> fetch record
-- KEYS[7]  minutes       STRING redisson_delay_queue_minutes:{N}  activity history (see record_history.lua)
-- KEYS[8]  hours         STRING redisson_delay_queue_hours:{N}
-- KEYS[9]  lane_of +lane HASH   redisson_delay_queue_lane_of:{N}  optional: the dead letter
--                               keeps the lane its fetch record names (dead.lua's requeue
--                               puts it back there)
--
-- ARGV[1]  redis_message_id
-- ARGV[2]  worker_id
-- ARGV[3]  final?  optional: the message as it failed (encoded, with the traceback Dramatiq
--          recorded in its options), stored in place of the copy fetched ("": none)
--
-- A message fetched through lanes uses concurrency slots (see ack.lua): the caller then adds
-- KEYS[10] flow +slots   HASH   redisson_delay_queue_flow:{N}
-- KEYS[11] levels +slots ZSET   redisson_delay_queue_levels:{N}
-- KEYS[12] idle +slots   ZSET   redisson_delay_queue_idle:{N}
-- ARGV[4]  lane_prefix +slots  the lanes' key prefix (ARGV[3] is then given, "" for none)
-- ARGV[5]  ring_prefix +slots  the rings' key prefix
-- ARGV[6]  wake_prefix +slots  the wake channels' prefix
-- and the slots are given back as an ack gives them.
--
-- Memory: the first write is the SREM (never grows memory), so a nack runs on a full
-- server too: the message moves between two hashes, it is never left half-moved.
--
-- Returns: 1 if the message was moved (and counted as failed), else 0.

-- include: record_history.lua
-- include: wake.lua
-- include: record_lane.lua
-- include: flow_context.lua
-- include: flow_lib.lua

local t = redis.call("TIME")
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local moved = 0
if redis.call("SREM", KEYS[1], ARGV[1]) == 1 then
    local record = KEYS[9] and redis.call("HGET", KEYS[6], ARGV[1])
    local lane = record_lane(record)
    redis.call("HDEL", KEYS[6], ARGV[1])
    if KEYS[10] then
        local flow = flow_context(nil, KEYS[10], KEYS[11], nil, ARGV[4], ARGV[5])
        if flow_lib().release(flow, { record }) > 0 then
            wake(KEYS[12], ARGV[6], 1)
        end
    end
    local data = redis.call("HGET", KEYS[2], ARGV[1])
    if data then
        redis.call("HDEL", KEYS[2], ARGV[1])
        redis.call("ZADD", KEYS[3], now_ms, ARGV[1])
        redis.call("HSET", KEYS[4], ARGV[1], (ARGV[3] and ARGV[3] ~= "") and ARGV[3] or data)
        if lane ~= PLAIN_LANE then
            redis.call("HSET", KEYS[9], ARGV[1], lane)
        end
        moved = 1
        record_history(KEYS[7], KEYS[8], now_ms, 2)
    end
end
redis.call("ZADD", KEYS[5], now_ms, ARGV[2])
return moved
