-- reap: run again the messages of a queue's consumers whose processes stopped beating.
--
-- KEYS[1]  alive       ZSET    redisson_delay_queue_alive:{N}  worker id -> last liveness beat
--                               (epoch ms, server clock), one per process
-- KEYS[2]  ready       LIST    <ns>:<queue>  ready queue
-- KEYS[3]  ready_msgs  HASH    <ns>:<queue>.msgs
-- KEYS[4]  idle        ZSET    redisson_delay_queue_idle:{N}  consumer token -> messages it can start now
-- KEYS[5]  channel     CHANNEL redisson_delay_queue_channel:{N}  wake channels are this .. ":wake:{token}"
-- KEYS[6]  fetched     HASH    redisson_delay_queue_fetched:{N}  fetch records (the ids put back lose theirs)
-- KEYS[7]  flow        HASH    redisson_delay_queue_flow:{N}  the flow keys (see flow_context.lua)
-- KEYS[8]  levels      ZSET    redisson_delay_queue_levels:{N}
-- KEYS[9]  lane_of     HASH    redisson_delay_queue_lane_of:{N}
-- KEYS[10..] acks      SET     <ns>:__acks__.<worker id>.<queue>  the ack set of each worker in ARGV[6..]
--
-- ARGV[1]  timeout_ms  liveness timeout (ms): a worker is dead when its last beat is more than this
--          older than the newest beat in KEYS[1]
-- ARGV[2]  forget_ms  forget after (ms): entries whose last beat is more than this older than the
--          newest are dropped (their process is long gone)
-- ARGV[3]  confirmed  C: how many of the ids that follow the caller found dead by their connections
--          (every wake-channel subscription of the worker gone for a while): those are
--          taken as dead; the others, found dead by their beats (ZRANGE of KEYS[1]), are
--          checked again here, and one that beat meanwhile is left alone
-- ARGV[4]  lane_prefix  the lanes' key prefix (from _keys.py)
-- ARGV[5]  ring_prefix  the rings' key prefix
-- ARGV[6..] worker_ids
--
-- Lanes: while the queue's flow is on, each id goes back to the head of the lane its fetch
-- record names (the ready queue when it names none), and the concurrency slots the records say their messages use are
-- given back (flow_context.lua): the idle consumers woken take them.
--
-- Dead is relative to the newest beat, not to the server clock: when no process could beat
-- (the server was stopped or unreachable for a while, every entry equally old) nobody is
-- dead, and the live ones beat again within a beat interval of the server coming back.
--
-- A dead worker stays in KEYS[1] until forgotten, so a message that lands in its ack set
-- later (a fetch or transfer it sent before it died, run by a server that was stopped) is
-- put back by the next call.
--
-- Memory: each LPUSH follows the DEL of the ack set it empties, so this runs on a server at
-- its maxmemory limit.
--
-- Returns: {messages put back, dead workers}.
-- returns: {requeued, dead}

-- include: variadic.lua
-- include: wake.lua
-- include: flow_context.lua
-- include: flow_on.lua
-- include: flow_lib.lua

local alive, ready, ready_msgs, idle, channel = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local timeout, forget = tonumber(ARGV[1]), tonumber(ARGV[2])

local newest = redis.call("ZRANGE", alive, -1, -1, "WITHSCORES")
local newest_ms = #newest > 0 and tonumber(newest[2]) or 0

local flow = flow_context(ready, KEYS[7], KEYS[8], KEYS[9], ARGV[4], ARGV[5])
local laned = flow_on(flow)
local by_connection = tonumber(ARGV[3])
local requeued, dead, freed = 0, 0, 0
for i = 6, #ARGV do
    local beat = redis.call("ZSCORE", alive, ARGV[i])
    if i - 5 <= by_connection or (beat and newest_ms - tonumber(beat) > timeout) then
        dead = dead + 1
        local acks = KEYS[i + 4]
        local ids = redis.call("SMEMBERS", acks)
        redis.call("DEL", acks)
        local records = {}
        if #ids > 0 then
            if laned then
                records = redis.call("HMGET", KEYS[6], unpack(ids))
            end
            variadic("HDEL", KEYS[6], ids)
        end
        local back, back_records = {}, {}
        for j = 1, #ids do
            if redis.call("HEXISTS", ready_msgs, ids[j]) == 1 then
                if laned then
                    back[#back + 1] = ids[j]
                    back_records[#back] = records[j]
                else
                    redis.call("LPUSH", ready, ids[j])
                end
                requeued = requeued + 1
            end
        end
        if laned then
            flow_lib().put_back(flow, back, back_records)
            freed = freed + flow_lib().release(flow, records)
        end
    end
end
if requeued > 0 or freed > 0 then
    wake(idle, channel .. ":wake:{", math.max(requeued, freed))
end
if newest_ms > 0 then
    redis.call("ZREMRANGEBYSCORE", alive, "-inf", "(" .. (newest_ms - forget))
end
return {requeued, dead}
