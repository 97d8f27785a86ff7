-- requeue: give fetched, unprocessed messages back to the head of the ready queue.
--
-- KEYS[1]  acks            SET     <ns>:__acks__.<worker id>.<queue>
-- KEYS[2]  ready_msgs      HASH    <ns>:<queue>.msgs
-- KEYS[3]  ready           LIST    <ns>:<queue>
-- KEYS[4]  idle            ZSET    redisson_delay_queue_idle:{N}  consumer token -> messages it can start now
-- KEYS[5]  channel         CHANNEL redisson_delay_queue_channel:{N}  wake channels are this .. ":wake:{token}"
-- KEYS[6]  fetched         HASH    redisson_delay_queue_fetched:{N}  fetch records (the ids put back lose theirs)
-- KEYS[7]  flow +lanes     HASH    redisson_delay_queue_flow:{N}  optional, the +lanes keys: the flow
--                                  keys (see flow_context.lua), with ARGV[1] and ARGV[2]
-- KEYS[8]  levels +lanes   ZSET    redisson_delay_queue_levels:{N}
-- KEYS[9]  lane_of +lanes  HASH    redisson_delay_queue_lane_of:{N}
--
-- ARGV[1]  lane_prefix +lanes  the lanes' key prefix
-- ARGV[2]  ring_prefix +lanes  the rings' key prefix
-- ARGV[3..] ids  redis message ids, in the order they were fetched (ARGV[1..] without +lanes)
--
-- Lanes: while the queue's flow is on, each id goes back to the head of the lane its fetch
-- record names (the ready queue when it names none), and the concurrency slots the records say their messages use are
-- given back (flow_context.lua).
--
-- An id is put back only if this call removed it from the ack set: an id acked (or
-- requeued) meanwhile is left alone, so a requeue never duplicates a message.
--
-- Memory: each LPUSH follows its SREM (never grows memory), so requeues run on a
-- server at its maxmemory limit.
--
-- The messages put back wake as many idle consumers (see wake.lua): a worker that
-- shuts down hands its prefetched messages to idle ones at once.
--
-- Returns: the number of messages put back.

-- include: wake.lua
-- include: flow_context.lua
-- include: flow_on.lua
-- include: flow_lib.lua

local flow, first = nil, 1
if KEYS[7] then
    flow = flow_context(KEYS[3], KEYS[7], KEYS[8], KEYS[9], ARGV[1], ARGV[2])
    first = 3
end
if flow and flow_on(flow) then
    local back, records, all = {}, {}, {}
    for i = first, #ARGV do
        if redis.call("SREM", KEYS[1], ARGV[i]) == 1 then
            local record = redis.call("HGET", KEYS[6], ARGV[i])
            redis.call("HDEL", KEYS[6], ARGV[i])
            all[#all + 1] = record
            if redis.call("HEXISTS", KEYS[2], ARGV[i]) == 1 then
                back[#back + 1] = ARGV[i]
                records[#back] = record
            end
        end
    end
    flow_lib().put_back(flow, back, records)
    local freed = flow_lib().release(flow, all)
    if #back > 0 or freed > 0 then
        wake(KEYS[4], KEYS[5] .. ":wake:{", math.max(#back, freed))
    end
    return #back
end

local count = 0
for i = #ARGV, first, -1 do
    if redis.call("SREM", KEYS[1], ARGV[i]) == 1 then
        redis.call("HDEL", KEYS[6], ARGV[i])
        if redis.call("HEXISTS", KEYS[2], ARGV[i]) == 1 then
            redis.call("LPUSH", KEYS[3], ARGV[i])
            count = count + 1
        end
    end
end
if count > 0 then
    wake(KEYS[4], KEYS[5] .. ":wake:{", count)
end
return count
