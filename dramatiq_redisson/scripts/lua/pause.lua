-- pause: pause or resume a queue, fleet-wide.
--
-- KEYS[1]  paused STRING redisson_delay_queue_paused:{N}   since when the queue is paused (epoch ms)
--
-- ARGV[1]  op  "pause" or "resume" (anything else: an error, nothing written)
--
-- While KEYS[1] exists, fetch.lua hands out nothing and transfer.lua hands nothing off:
-- consumers start no message of the queue (those in flight finish); due messages still
-- move to the ready queue and sends are accepted. Consumers poll the state while paused.
--
-- Returns: {1 if the state changed (0: it was so already), since when the queue is
--           paused (epoch ms, server clock) or -1}
-- returns: {changed, since}

if ARGV[1] ~= "pause" and ARGV[1] ~= "resume" then
    return redis.error_reply("ERR pause: the operation is \"pause\" or \"resume\", not " .. tostring(ARGV[1]))
end
local t = redis.call("TIME")
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if ARGV[1] == "pause" then
    if redis.call("SET", KEYS[1], now_ms, "NX") then
        return {1, now_ms}
    end
    return {0, tonumber(redis.call("GET", KEYS[1])) or now_ms}
end
return {redis.call("DEL", KEYS[1]), -1}
