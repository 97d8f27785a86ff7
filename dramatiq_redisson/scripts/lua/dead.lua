-- dead: requeue or remove dead letters of a queue, by id or the oldest `batch` of them.
--
-- KEYS[1]  xq              ZSET    <ns>:<queue>.XQ  dead letter id -> time of death (epoch ms)
-- KEYS[2]  xq_msgs         HASH    <ns>:<queue>.XQ.msgs  dead letter id -> encoded message
-- KEYS[3]  ready           LIST    <ns>:<queue>  ready queue (redis message ids)
-- KEYS[4]  ready_msgs      HASH    <ns>:<queue>.msgs  redis message id -> encoded message
-- KEYS[5]  idle            ZSET    redisson_delay_queue_idle:{N}  consumer token -> messages it can start now
-- KEYS[6]  channel         CHANNEL redisson_delay_queue_channel:{N}  wake channels are this .. ":wake:{token}"
-- KEYS[7]  flow +lanes     HASH    redisson_delay_queue_flow:{N}  optional, the +lanes keys: the flow
--                                  keys (see flow_context.lua), with ARGV[3] and ARGV[4]
-- KEYS[8]  levels +lanes   ZSET    redisson_delay_queue_levels:{N}
-- KEYS[9]  lane_of +lanes  HASH    redisson_delay_queue_lane_of:{N}
--
-- ARGV[1]  action  "requeue" or "remove"
-- ARGV[2]  batch  with no ids, act on up to this many of the oldest dead letters
-- ARGV[3]  lane_prefix +lanes  the lanes' key prefix
-- ARGV[4]  ring_prefix +lanes  the rings' key prefix
-- ARGV[5..] ids  dead letter ids (redis message ids; from ARGV[3] without +lanes)
--
-- A requeued message goes to the tail of the ready queue under the same redis message
-- id, with the data it died with, and wakes an idle consumer. Each id leaves the dead
-- letters in the same step, so it runs once per requeue: requeuing it again finds it
-- gone. An id whose redis message id is already queued or in flight (its data is in
-- the ready queue's hash) only leaves the dead letters; it is not pushed twice.
--
-- Memory: the first write is a ZREM (never grows memory), so both run on a full
-- server (a requeue moves data from one hash to another).
--
-- Lanes: a dead letter with a lane (nack.lua kept it in lane_of) is requeued to that lane
-- (turning the queue's flow on), and loses the record when it leaves the dead letters.
--
-- Returns: the number of dead letters requeued or removed.

-- include: wake.lua
-- include: flow_context.lua
-- include: flow_on.lua
-- include: flow_lib.lua

local xq, xq_msgs, ready, ready_msgs = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local action, batch = ARGV[1], tonumber(ARGV[2])
if action ~= "requeue" and action ~= "remove" then
    return redis.error_reply("dead: unknown action " .. tostring(action))
end

local flow, first = nil, 3
if KEYS[7] then
    flow = flow_context(ready, KEYS[7], KEYS[8], KEYS[9], ARGV[3], ARGV[4])
    first = 5
end
local ids = {}
if #ARGV >= first then
    for i = first, #ARGV do
        if redis.call("ZSCORE", xq, ARGV[i]) then
            ids[#ids + 1] = ARGV[i]
        end
    end
else
    ids = redis.call("ZRANGE", xq, 0, batch - 1)
end
if #ids == 0 then
    return 0
end
local data = redis.call("HMGET", xq_msgs, unpack(ids))
redis.call("ZREM", xq, unpack(ids))
redis.call("HDEL", xq_msgs, unpack(ids))
local lanes = flow and redis.call("HMGET", flow.lane_of, unpack(ids))
if flow then
    redis.call("HDEL", flow.lane_of, unpack(ids))
end
if action == "remove" then
    return #ids
end
local queued = redis.call("HMGET", ready_msgs, unpack(ids))
local pairs_, pushed, pushed_lanes, laned = {}, {}, {}, false
for i = 1, #ids do
    if data[i] and not queued[i] then
        pairs_[#pairs_ + 1] = ids[i]
        pairs_[#pairs_ + 1] = data[i]
        pushed[#pushed + 1] = ids[i]
        pushed_lanes[#pushed] = lanes and lanes[i]
        laned = laned or (lanes and lanes[i]) and true or false
    end
end
if #pushed > 0 then
    redis.call("HSET", ready_msgs, unpack(pairs_))
    if laned then
        flow_lib().enable(flow.flag)
    end
    if flow and flow_on(flow) then
        flow_lib().push(flow, pushed, pushed_lanes, false)
    else
        redis.call("RPUSH", ready, unpack(pushed))
    end
    wake(KEYS[5], KEYS[6] .. ":wake:{", #pushed)
end
return #ids
