-- heartbeat: mark a worker alive, even on a full server.
--
-- KEYS[1]  heartbeats|alive   ZSET  <ns>:__heartbeats__  worker id -> last seen (epoch ms,
--          server clock); or a queue's redisson_delay_queue_alive:{N} (a process's liveness beat)
-- KEYS[2]  registry +registry SET   <ns>:__queues__  names of the known queues (see _keys.py)
--          (left out on a cluster, where it lives in another slot)
--
-- ARGV[1]  worker_id
-- ARGV[2]  queue_name +registry  the name of the queue the heartbeat comes from (listed in KEYS[2], so that
--          operators' tools find every consumed queue)
--
-- Memory: the first write is a ZREM, which never grows memory, so a server at its
-- maxmemory limit (noeviction) runs the ZADD that follows instead of refusing the
-- script: a busy worker stays alive while the server is full, and its in-flight
-- messages are not requeued as a dead worker's.
--
-- Returns: the server time written, in epoch ms.

local t = redis.call("TIME")
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call("ZREM", KEYS[1], ARGV[1])
redis.call("ZADD", KEYS[1], now_ms, ARGV[1])
if KEYS[2] then
    redis.call("SADD", KEYS[2], ARGV[2])
end
return now_ms
