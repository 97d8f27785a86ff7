-- enqueue: put messages on a ready queue, and wake idle consumers when it was empty.
--
-- KEYS[1]  LIST     <ns>:<queue>        ready queue (redis message ids)
-- KEYS[2]  HASH     <ns>:<queue>.msgs   redis message id -> encoded message
-- KEYS[3]  CHANNEL  redisson_delay_queue_channel:{N}
--
-- ARGV[1..] repeated pairs: redis message id, encoded message
--
-- The announcement is "0": "a message is ready" (never a due time, so idle consumers
-- fetch at once without running a transfer). A busy queue (already non-empty) costs
-- no PUBLISH.
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
    redis.call("PUBLISH", channel, "0")
end
return length
