-- release: a consumer leaves its queue (it closes): drop it from the idle and consumer
-- registries and, if it holds the transfer lease, give the lease up and ask another
-- consumer to take it over at once (instead of when the lease would have lapsed).
--
-- KEYS[1]  lease     STRING  redisson_delay_queue_lease:{N}      "<token> <expiry ms>" (PX)
-- KEYS[2]  consumers ZSET    redisson_delay_queue_consumers:{N}  consumer token -> last seen (epoch ms)
-- KEYS[3]  idle      ZSET    redisson_delay_queue_idle:{N}       consumer token -> messages it can start now
-- KEYS[4]  channel   CHANNEL redisson_delay_queue_channel:{N}    wake channels are this .. ":wake:{token}"
--
-- ARGV[1]  token  the leaving consumer's token
--
-- The successor is the consumer seen most recently that still listens on its wake
-- channel; it gets "-1" there (take the lease). The others find the lease free when
-- they next check it.
--
-- Memory: every write deletes (never grows memory), so it runs on a full server.
--
-- Returns: 1 if the lease was given up (and a successor asked, if one listens), else 0.

local lease, consumers, idle, channel = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local token = ARGV[1]

redis.call("ZREM", idle, token)
redis.call("ZREM", consumers, token)
local holder = redis.call("GET", lease)
if not holder or string.sub(holder, 1, #token + 1) ~= token .. " " then
    return 0
end
redis.call("DEL", lease)
local candidates = redis.call("ZRANGE", consumers, -10, -1)
for i = #candidates, 1, -1 do
    if redis.call("PUBLISH", channel .. ":wake:{" .. candidates[i] .. "}", "-1") > 0 then
        break
    end
end
return 1
