-- shards: change the stored shard layout of a queue (issue 36; see _shards.py), atomically.
--
-- KEYS[1]  HASH  redisson_delay_queue_shards:{N}   "active": the suffixes of the shards
--          producers send to, in order ("0,17,42"); "retired": those being drained (""
--          or absent). N is the queue's own tag: the layout lives in shard 0's slot.
--
-- ARGV[1]  the "active" value the caller read ("" when there was none)
-- ARGV[2]  the new "active"; ARGV[3] the new "retired"
--
-- Compare and set: the layout changes only if "active" is still what the caller read
-- (another process may have changed it meanwhile: the caller reads the layout again and
-- decides again). A value that is not a comma-separated list of suffixes (ints, 0 first
-- in "active") is refused and nothing is written.
--
-- Returns: {1 if written, else 0; "active" now or ""; "retired" now or ""}

local function suffixes(text, zero_first)
    if text == "" then
        return not zero_first
    end
    local first = true
    for part in string.gmatch(text .. ",", "([^,]*),") do
        if not string.match(part, "^%d+$") then
            return false
        end
        if first and zero_first and part ~= "0" then
            return false
        end
        first = false
    end
    return true
end

if not suffixes(ARGV[2], true) or not suffixes(ARGV[3], false) then
    return redis.error_reply("ERR shards: a layout is comma-separated suffixes, 0 first in active")
end
local now = redis.call("HMGET", KEYS[1], "active", "retired")
local active, retired = now[1] or "", now[2] or ""
if active ~= ARGV[1] then
    return { 0, active, retired }
end
redis.call("HSET", KEYS[1], "active", ARGV[2])
if ARGV[3] == "" then
    redis.call("HDEL", KEYS[1], "retired")
else
    redis.call("HSET", KEYS[1], "retired", ARGV[3])
end
return { 1, ARGV[2], ARGV[3] }
