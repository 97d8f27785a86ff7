-- record_history(minutes, hours, now_ms, kind): count one event in the activity history:
-- per queue, how many messages were processed (acked), failed (dead-lettered) and
-- retried (acked after Retries scheduled a retry), per minute for the last 25 hours and per hour for the last 31 days. (Included by
-- ack.lua and nack.lua; read by history.lua; the layout is parsed by _history.py.)
--
-- Two STRING rings per queue, read and written with BITFIELD (u32 fields, big-endian),
-- so memory is fixed whatever the traffic: at most 24 016 + 11 904 bytes per queue.
--
--   redisson_delay_queue_minutes:{N}  bytes 0..3: the last minute that had an event and
--                                     is not yet added to its hour (0: none); then
--                                     HISTORY_MINUTES slots of 16 bytes at
--                                     16 + 16 * (minute % HISTORY_MINUTES)
--   redisson_delay_queue_hours:{N}    HISTORY_HOURS slots of 16 bytes at
--                                     16 * (hour % HISTORY_HOURS)
--
-- A slot is {stamp, processed, failed, retried}: the stamp is the minute (hour) number
-- since the epoch, on the server clock, that the counts belong to; a slot whose stamp is
-- another number is stale (left from a lap before) and reads as zeros.
--
-- The history never fails the ack or nack that records it: a refused BITFIELD (a user
-- whose ACL rule predates the history) skips the count.
--
-- The common case costs one BITFIELD: read the slot's stamp and add 1 to its counter.
-- The first event of a minute finds a stale stamp and resets the slot; it also adds the
-- previous active minute, now complete, to its hour slot (once: the header then names
-- the new minute). So the hour ring holds every minute but the last active one, which
-- a reader adds itself.
--
-- include: history_minute_at.lua
-- include: add_to_hour.lua
-- include: one_event.lua
-- kind: 1 processed, 2 failed, 3 retried. now_ms: the server clock, or an ack's estimate
-- of it (ack.lua), which may be a moment behind: an event can then arrive for a minute
-- that another call already closed (the header names a later one). Such a late event
-- counts in its minute and, since that minute's roll-up is done, in its hour directly.
local function record_history(minutes, hours, now_ms, kind)
    local minute = math.floor(now_ms / 60000)
    local at = history_minute_at(minute)
    -- (u32 wraps after 4 294 967 295 events in one minute: no saturation check needed)
    local got = redis.pcall("BITFIELD", minutes, "GET", "u32", at, "INCRBY", "u32", at + 32 * kind, 1,
        "GET", "u32", 0)
    if got.err then
        -- (A user whose ACL rule predates the history, without +bitfield. The ack or nack
        -- itself must go on; the worker's permission probe said so at start.)
        return
    end
    local last = got[3]
    local late = last > minute -- its minute was rolled up already
    if got[1] == minute then
        if late then
            add_to_hour(hours, math.floor(minute / 60), one_event(kind))
        end
        return
    end
    -- The first event of this minute (its slot holds a lap before). Unless it is late, add
    -- the last active minute to its hour first, and name this one in the header.
    if not late and last ~= 0 and last < minute then
        local last_at = history_minute_at(last)
        local c = redis.call("BITFIELD", minutes, "GET", "u32", last_at, "GET", "u32", last_at + 32,
            "GET", "u32", last_at + 64, "GET", "u32", last_at + 96)
        if c[1] == last then
            if last_at == at then
                c[1 + kind] = c[1 + kind] - 1 -- the same slot, a lap later: counted just now
            end
            add_to_hour(hours, math.floor(last / 60), { c[2], c[3], c[4] })
        end
    end
    local fresh = one_event(kind)
    local header = late and {} or { "SET", "u32", 0, minute }
    redis.call("BITFIELD", minutes, "SET", "u32", at, minute, "SET", "u32", at + 32, fresh[1],
        "SET", "u32", at + 64, fresh[2], "SET", "u32", at + 96, fresh[3], unpack(header))
    if late then
        add_to_hour(hours, math.floor(minute / 60), fresh) -- the hour gets it directly
    end
end
