-- clear: drop every scheduled message of a queue, atomically.
--
-- KEYS[1]  ZSET   redisson_delay_queue_timeout:{N}
-- KEYS[2]  LIST   redisson_delay_queue:{N}
-- KEYS[3]  HASH   redisson_delay_queue_msgs:{N}
-- KEYS[4]  LIST   redisson_delay_queue_compact:{N}
-- KEYS[5]  STRING redisson_delay_queue_cursor:{N}
--
-- Keys are unlinked, so a large queue is freed off the server's main thread.
--
-- Returns: the number of scheduled messages that were dropped.

local count = redis.call("ZCARD", KEYS[1])
redis.call("UNLINK", KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5])
return count
