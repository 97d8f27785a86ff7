-- bury: move entries that cannot be decoded from a list + hash pair to the dead letters.
--
-- KEYS[1]  legacy_dq       LIST  <ns>:<queue>.DQ  source list of ids (read from its head): the
--                                built-in broker's delay queue
-- KEYS[2]  legacy_dq_msgs  HASH  <ns>:<queue>.DQ.msgs  source id -> data
-- KEYS[3]  xq              ZSET  <ns>:<queue>.XQ  dead letter id -> time of death (epoch ms)
-- KEYS[4]  xq_msgs         HASH  <ns>:<queue>.XQ.msgs
--
-- ARGV[1..] ids  taken from the head of the source list
--
-- Returns: the number of entries moved.

local t = redis.call("TIME")
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local moved = 0
for i = 1, #ARGV do
    local data = redis.call("HGET", KEYS[2], ARGV[i])
    redis.call("LREM", KEYS[1], 1, ARGV[i])
    if data then
        redis.call("HDEL", KEYS[2], ARGV[i])
        redis.call("ZADD", KEYS[3], now_ms, ARGV[i])
        redis.call("HSET", KEYS[4], ARGV[i], data)
        moved = moved + 1
    end
end
return moved
