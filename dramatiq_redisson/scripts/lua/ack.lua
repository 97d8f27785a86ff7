-- ack: a fetched message was processed; forget it, and count it in the history.
--
-- KEYS[1]  acks          SET    <ns>:__acks__.<worker id>.<queue>
-- KEYS[2]  ready_msgs    HASH   <ns>:<queue>.msgs
-- KEYS[3]  heartbeats    ZSET   <ns>:__heartbeats__
-- KEYS[4]  fetched       HASH   redisson_delay_queue_fetched:{N}  redis message id -> fetch record
-- KEYS[5]  minutes       STRING redisson_delay_queue_minutes:{N}  activity history (see record_history.lua)
-- KEYS[6]  hours         STRING redisson_delay_queue_hours:{N}
--
-- ARGV[1]  redis_message_id
-- ARGV[2]  worker_id
-- ARGV[3]  beat  "0": leave the heartbeat alone (see fetch.lua); else write it
-- ARGV[4]  outcome  "1": the message was processed; "3": it failed and a retry is scheduled
-- ARGV[5]  clock?  optional: the caller's estimate of the server clock (epoch ms), from its last
--          transfer's reply and a monotonic clock since: the history's minute and the
--          heartbeat take it instead of a TIME call; "" or absent: TIME. (An estimate a
--          moment behind the server's at a minute's start is handled by record_history.lua.)
--
-- A message fetched through lanes uses concurrency slots (fetch.lua's reply ended with
-- "slots"): the caller then adds the keys marked +slots,
-- KEYS[7]  flow +slots   HASH   redisson_delay_queue_flow:{N}  concurrency slots in use, blocked lanes (flow_context.lua)
-- KEYS[8]  levels +slots ZSET   redisson_delay_queue_levels:{N}
-- KEYS[9]  idle +slots   ZSET   redisson_delay_queue_idle:{N}  consumer token -> messages it can start now
-- ARGV[6]  lane_prefix +slots  the lanes' key prefix
-- ARGV[7]  ring_prefix +slots  the rings' key prefix
-- ARGV[8]  wake_prefix +slots  the wake channels' prefix
-- and the slots the fetch record names are given back: a lane of a group that was at its
-- limit returns to its ring, and an idle consumer is woken per slot freed (wake.lua).
-- A repeated ack finds no record and gives nothing back.
--
-- A thread is free again (issue 46): a consumer listed in the idle registry with a score
-- below what it can start now adds, after the above, the keys marked +idle (without the
-- +slots keys they are KEYS[7] and KEYS[8]: a group left out moves the later keys up)
-- KEYS[10] idle +idle    ZSET   redisson_delay_queue_idle:{N}
-- KEYS[11] ready +idle   LIST   <ns>:<queue>  the ready queue
-- ARGV[9]  idle +idle  "idle" (ARGV[6] without the +slots group)
-- ARGV[10] idle_token +idle  its token
-- ARGV[11] idle_score +idle  its new score
-- ARGV[12] idle_channel +idle  its wake channel
-- Its entry takes the new score (ZADD XX: a consumer woken meanwhile stays out), so that
-- enqueues and transfers can wake it. But if messages wait in the ready queue (with lanes: always, as
-- the lanes are not counted here), wake-ups passed them over (every thread was busy, or
-- its listing lagged): its own wake channel gets "0" instead, and it fetches them.
--
-- A done record (issue 58, broker.message_state): while the broker's done_retention is on,
-- an ack of a processed message (outcome "1") adds, after the groups above (a group left
-- out moves the later keys and arguments up),
-- KEYS[12] done +done    ZSET   redisson_delay_queue_done:{N}  message id -> when its ack finished it (epoch ms)
-- ARGV[13] done +done  "done"
-- ARGV[14] done_id +done  the message id (the record's member)
-- ARGV[15] done_trim +done  "": nothing more; else the retention (ms): first drop the records
--          older than it, and set the key to expire a minute after it (the records of a
--          queue that stops acking go too); each process asks for it about once a second
--          per queue, so that a record costs one ZADD
-- Without the group the ack runs as it did without the record: its optional groups are
-- looked for by one test of the argument after the required ones (+idle's and +done's).
--
-- Memory: the first write is the SREM (never grows memory), so acks run on a server
-- at its maxmemory limit, where they are what frees memory.
--
-- Returns: 1 if the message was in the ack set, else 0 (nothing is counted then: an
--          ack repeated after a lost reply counts once).

-- include: record_history.lua
-- include: wake.lua
-- include: flow_context.lua
-- include: flow_lib.lua

local uses_slots = ARGV[6] ~= nil and ARGV[6] ~= "idle" and ARGV[6] ~= "done" -- fetched through lanes
local removed = redis.call("SREM", KEYS[1], ARGV[1])
local now_ms = tonumber(ARGV[5] or "")
if not now_ms and (removed == 1 or ARGV[3] ~= "0") then
    local t = redis.call("TIME")
    now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
if removed == 1 then
    redis.call("HDEL", KEYS[2], ARGV[1])
    if uses_slots then
        local flow = flow_context(nil, KEYS[7], KEYS[8], nil, ARGV[6], ARGV[7])
        if flow_lib().release(flow, { redis.call("HGET", KEYS[4], ARGV[1]) }) > 0 then
            wake(KEYS[9], ARGV[8], 1)
        end
    end
    redis.call("HDEL", KEYS[4], ARGV[1])
    record_history(KEYS[5], KEYS[6], now_ms, tonumber(ARGV[4]))
end
if ARGV[3] ~= "0" then
    redis.call("ZADD", KEYS[3], now_ms, ARGV[2])
end
local k, a = uses_slots and 10 or 7, uses_slots and 9 or 6
if ARGV[a] then -- the +idle group, the +done group, or both
    if ARGV[a] == "idle" then
        if uses_slots or redis.call("LLEN", KEYS[k + 1]) > 0 then
            redis.call("PUBLISH", ARGV[a + 3], "0") -- messages wait: its consumer fetches them
        else
            redis.call("ZADD", KEYS[k], "XX", ARGV[a + 2], ARGV[a + 1])
        end
        k, a = k + 2, a + 4
    end
    if ARGV[a] == "done" and removed == 1 then
        if ARGV[a + 2] ~= "" then
            local retention = tonumber(ARGV[a + 2])
            redis.call("ZREMRANGEBYSCORE", KEYS[k], "-inf", "(" .. (now_ms - retention))
            redis.call("ZADD", KEYS[k], now_ms, ARGV[a + 1])
            redis.call("PEXPIRE", KEYS[k], retention + 60000)
        else
            redis.call("ZADD", KEYS[k], now_ms, ARGV[a + 1])
        end
    end
end
return removed
