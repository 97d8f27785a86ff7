-- clear: drop every scheduled message of a queue, atomically.
--
-- KEYS[1]  timeout_zset   ZSET   redisson_delay_queue_timeout:{N}
-- KEYS[2]  backup_list    LIST   redisson_delay_queue:{N}
-- KEYS[3]  payloads       HASH   redisson_delay_queue_msgs:{N}
-- KEYS[4]  compact_list   LIST   redisson_delay_queue_compact:{N}
-- KEYS[5]  compact_cursor STRING redisson_delay_queue_cursor:{N}
-- KEYS[6]  dedupe +dedupe HASH   redisson_delay_queue_dedupe:{N}   dedupe key -> message id (optional)
-- KEYS[7]  keyed +dedupe  HASH   redisson_delay_queue_keyed:{N}    message id -> ttl:dedupe key (optional)
-- KEYS[8]  lane_of +lane  HASH   redisson_delay_queue_lane_of:{N}  message id -> lane (optional)
-- ARGV none
--
-- Keys are unlinked, so a large queue is freed off the server's main thread. The dedupe
-- keys of the dropped messages go with them; throttle windows of messages that already
-- moved (redisson_delay_queue_holds:{N}) stay until they end.
--
-- Returns: the number of scheduled messages that were dropped.

local count = redis.call("ZCARD", KEYS[1])
redis.call("UNLINK", unpack(KEYS))
return count
