-- shards: change the stored shard layout of a queue (issue 36; see sharding/_shards.py), atomically.
--
-- KEYS[1]  shards HASH  redisson_delay_queue_shards:{N}   "active": the suffixes of the shards
--          producers send to, in order ("0,17,42"); "retired": those being drained (""
--          or absent); "r<suffix>": when (server epoch ms) each retired shard was
--          retired; "a<suffix>": when each shard added to a layout that existed was
--          added. N is the queue's own tag: the layout lives in shard 0's slot.
--
-- ARGV[1]  op  "read", "set" or "drop"
-- ARGV[2..] rest  per operation:
--   read:  ARGV[2] ms: the layout, and which active shards were added less than that long
--          ago (producers do not send to them yet: every consumer reads the layout again
--          every safety interval, and starts consuming a new shard then). Writes nothing.
--   set:   ARGV[2] the "active" value the caller read ("" when there was none),
--          ARGV[3] the new "active", ARGV[4] the new "retired". Compare and set: the
--          layout changes only if "active" is still what the caller read (another process
--          may have changed it meanwhile: the caller reads the layout again and decides
--          again). A shard newly retired is stamped with the time; one taken back loses
--          its stamp; one new to a layout that existed is stamped as added. A value that is not a comma-separated list of suffixes (ints, 0
--          first in "active") is refused and nothing is written.
--   drop:  ARGV[2] a retired suffix, ARGV[3] ms: take the shard out of "retired" if it
--          was retired at least that long ago (by then no producer sends to it: each
--          reads the layout again every safety interval). The caller checked that it
--          holds nothing. A suffix in neither list counts as dropped (a retry).
--
-- Returns: {1 if written, else 0; "active" now or ""; "retired" now or ""}; "read":
-- {"active" or ""; "retired" or ""; the active suffixes added too recently, or ""}

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

local function members(text)
    local set = {}
    for part in string.gmatch(text, "[^,]+") do
        set[part] = true
    end
    return set
end

local function now_ms()
    local t = redis.call("TIME")
    return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local now = redis.call("HMGET", KEYS[1], "active", "retired")
local active, retired = now[1] or "", now[2] or ""

local function write_retired(value)
    if value == "" then
        redis.call("HDEL", KEYS[1], "retired")
    else
        redis.call("HSET", KEYS[1], "retired", value)
    end
end

if ARGV[1] == "read" then
    local age, now, fresh = tonumber(ARGV[2]) or 0, nil, {}
    for part in string.gmatch(active, "[^,]+") do
        local added = tonumber(redis.call("HGET", KEYS[1], "a" .. part) or "")
        if added then
            now = now or now_ms()
            if now - added < age then
                fresh[#fresh + 1] = part
            end
        end
    end
    return { active, retired, table.concat(fresh, ",") }
end

if ARGV[1] == "drop" then
    local suffix, age = ARGV[2], tonumber(ARGV[3])
    if not members(retired)[suffix] and not members(active)[suffix] then
        return { 1, active, retired } -- dropped already (a retried call)
    end
    local stamp = tonumber(redis.call("HGET", KEYS[1], "r" .. suffix) or "")
    if not members(retired)[suffix] or not age or not stamp or now_ms() - stamp < age then
        return { 0, active, retired }
    end
    local left = {}
    for part in string.gmatch(retired, "[^,]+") do
        if part ~= suffix then
            left[#left + 1] = part
        end
    end
    retired = table.concat(left, ",")
    write_retired(retired)
    redis.call("HDEL", KEYS[1], "r" .. suffix)
    return { 1, active, retired }
end

if ARGV[1] ~= "set" then
    return redis.error_reply("ERR shards: unknown operation " .. tostring(ARGV[1]))
end
if not suffixes(ARGV[3], true) or not suffixes(ARGV[4], false) then
    return redis.error_reply("ERR shards: a layout is comma-separated suffixes, 0 first in active")
end
if active ~= ARGV[2] then
    return { 0, active, retired }
end
local was_retired, now_retired = members(retired), members(ARGV[4])
local was_active, now_active = members(active), members(ARGV[3])
local stamp = nil
-- Each suffix that enters a list (and may be stamped) gets the time under ``prefix``;
-- each that leaves it loses its stamp.
local function restamp(prefix, was, now, stamped)
    for suffix in pairs(now) do
        if not was[suffix] and stamped(suffix) then
            stamp = stamp or now_ms()
            redis.call("HSET", KEYS[1], prefix .. suffix, stamp)
        end
    end
    for suffix in pairs(was) do
        if not now[suffix] then
            redis.call("HDEL", KEYS[1], prefix .. suffix)
        end
    end
end
-- Added: only to a layout that existed, and not taken back from the retired (consumers
-- never stopped reading those).
restamp("a", was_active, now_active, function(suffix)
    return active ~= "" and not was_retired[suffix]
end)
restamp("r", was_retired, now_retired, function()
    return true
end)
redis.call("HSET", KEYS[1], "active", ARGV[3])
write_retired(ARGV[4])
return { 1, ARGV[3], ARGV[4] }
