-- pending: how many messages of a queue are not yet processed, read together.
--
-- KEYS[1]  timeout_zset    ZSET  redisson_delay_queue_timeout:{N}  scheduled: member -> due time (epoch ms)
-- KEYS[2]  ready_msgs      HASH  <ns>:<queue>.msgs  data of ready and in-flight messages
-- KEYS[3]  legacy_dq_msgs  HASH  <ns>:<queue>.DQ.msgs  the built-in broker's delayed messages (not yet migrated)
-- KEYS[4]  chains +ticks   HASH  redisson_delay_queue_chains:{N}  optional: schedule name -> its scheduled tick: a
--                periodic actor's next tick is always scheduled and is not counted (a queue
--                with periodic actors would never be done)
--
-- A script rather than MULTI/EXEC: the counts must come from one moment (a message moving
-- between them is counted once), and on a full server (maxmemory, noeviction) Redis
-- before 7.4 and Valkey 7.2 refuse every command queued in a MULTI, reads included
-- (server.c, processCommand: reject_cmd_on_oom), while a script that only reads runs on
-- every version.
-- ARGV none
--
-- Returns: scheduled (but the periodic ticks) + ready + in flight + built-in delayed.

local scheduled = redis.call("ZCARD", KEYS[1])
if KEYS[4] then
    scheduled = math.max(0, scheduled - redis.call("HLEN", KEYS[4]))
end
return scheduled + redis.call("HLEN", KEYS[2]) + redis.call("HLEN", KEYS[3])
