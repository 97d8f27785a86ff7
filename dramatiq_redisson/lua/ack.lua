-- ack: a fetched message was processed; forget it.
--
-- KEYS[1]  SET   <ns>:__acks__.<worker id>.<queue>
-- KEYS[2]  HASH  <ns>:<queue>.msgs
-- KEYS[3]  ZSET  <ns>:__heartbeats__
--
-- ARGV[1]  redis message id
-- ARGV[2]  worker id
-- ARGV[3]  "0": leave the heartbeat alone (see fetch.lua); else write it
--
-- Memory: the first write is the SREM (never grows memory), so acks run on a server
-- at its maxmemory limit, where they are what frees memory.
--
-- Returns: 1 if the message was in the ack set, else 0.

local removed = redis.call("SREM", KEYS[1], ARGV[1])
if removed == 1 then
    redis.call("HDEL", KEYS[2], ARGV[1])
end
if ARGV[3] ~= "0" then
    local t = redis.call("TIME")
    redis.call("ZADD", KEYS[3], tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000), ARGV[2])
end
return removed
