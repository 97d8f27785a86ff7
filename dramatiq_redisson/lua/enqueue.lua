-- enqueue: put messages on a ready queue, and wake idle consumers when it was empty.
--
-- KEYS[1]  LIST     <ns>:<queue>        ready queue (redis message ids)
-- KEYS[2]  HASH     <ns>:<queue>.msgs   redis message id -> encoded message
-- KEYS[3]  CHANNEL  redisson_delay_queue_channel:{N}
--
-- ARGV[1..] repeated pairs: redis message id, encoded message
--
-- The announcement carries the server time in epoch ms: "something is due now".
-- A busy queue (already non-empty) costs no PUBLISH.
--
-- Returns: the length of the ready queue afterwards.

local ready, ready_msgs, channel = KEYS[1], KEYS[2], KEYS[3]
local length = 0
local pushed = 0
for i = 1, #ARGV, 2 do
    redis.call("HSET", ready_msgs, ARGV[i], ARGV[i + 1])
    length = redis.call("RPUSH", ready, ARGV[i])
    pushed = pushed + 1
end
if pushed > 0 and length == pushed then
    local t = redis.call("TIME")
    redis.call("PUBLISH", channel, string.format("%d", tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)))
end
return length
