-- dedupe_split(value): a keyed index value "<ttl>:<key>" -> ttl (number), key.
--
-- A queue's dedupe-key index (see _keys.py; unkey, trim_holds and expire_holds keep it
-- exact while messages leave the schedule, and its throttle windows bounded):
--   dedupe  HASH  redisson_delay_queue_dedupe:{N}  dedupe key -> message id (scheduled)
--   keyed   HASH  redisson_delay_queue_keyed:{N}   message id -> "<ttl ms>:<dedupe key>"
--   holds   ZSET  redisson_delay_queue_holds:{N}   dedupe key -> end of its throttle
--                                                   window (epoch ms, server clock)
--   throttle_copies
--           HASH  redisson_delay_queue_held:{N}    dedupe key -> a copy of the encoded
--                                                   message that ran in its throttle
--                                                   window (returned to dropped sends)
-- Invariants: dedupe[k] = id exactly when keyed[id] = "<ttl>:k" and id is scheduled;
-- a key is in at most one of dedupe and holds.
local function dedupe_split(value)
    local colon = string.find(value, ":", 1, true)
    return tonumber(string.sub(value, 1, colon - 1)), string.sub(value, colon + 1)
end
