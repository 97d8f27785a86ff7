-- history: read a queue's activity history (the rings of record_history.lua).
--
-- KEYS[1]  minutes STRING redisson_delay_queue_minutes:{N}
-- KEYS[2]  hours   STRING redisson_delay_queue_hours:{N}
--
-- ARGV[1]  minutes  how many of the last minutes to read (1..HISTORY_MINUTES, the
--          current one last)
-- ARGV[2]  hours  how many of the last hours (1..HISTORY_HOURS, the current one last)
--
-- Read only; a ring not written yet reads as zeros.
--
-- Returns: {server time (epoch ms), the last minutes' slots (16 bytes each, oldest
--           first), the last hours' slots, the last active minute not yet added to its
--           hour (0: none), that minute's slot}

-- include: history_minute_at.lua
-- include: history_hour_at.lua

local t = redis.call("TIME")
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

-- n slots of 16 bytes ending with the one of number `last`, in a ring of `size` slots
-- starting at byte `base` of `ring` (the string), oldest first; bytes past the end of
-- the string read as zeros. (The rings are read whole with GET: 36 KB at most, and no
-- command the ACL rule of earlier releases lacked.)
local function slots(ring, base, size, last, n)
    local parts = {}
    local first = last - n + 1
    local i = first
    while i <= last do
        local index = i % size
        local run = math.min(last - i + 1, size - index)
        local from = base + 16 * index
        local piece = string.sub(ring, from + 1, from + 16 * run)
        parts[#parts + 1] = piece .. string.rep("\0", 16 * run - #piece)
        i = i + run
    end
    return table.concat(parts)
end

local minute = math.floor(now_ms / 60000)
local hour = math.floor(minute / 60)
local n_minutes = math.max(1, math.min(tonumber(ARGV[1]), HISTORY_MINUTES))
local n_hours = math.max(1, math.min(tonumber(ARGV[2]), HISTORY_HOURS))
local minute_ring = redis.call("GET", KEYS[1]) or ""
local hour_ring = redis.call("GET", KEYS[2]) or ""
local pending = 0
if #minute_ring >= 4 then
    pending = struct.unpack(">I4", minute_ring)
end
local pending_slot = string.rep("\0", 16)
if pending > 0 then
    pending_slot = slots(minute_ring, 16, HISTORY_MINUTES, pending, 1)
end
return {
    now_ms,
    slots(minute_ring, 16, HISTORY_MINUTES, minute, n_minutes),
    slots(hour_ring, 0, HISTORY_HOURS, hour, n_hours),
    pending,
    pending_slot,
}
