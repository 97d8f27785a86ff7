-- rate_lib(): the rate functions, made on first use (a fetch of a queue without rates
-- defines none of them): live_starts, prune, log_starts, next_start, set_deferred_at,
-- undefer (each in its own file).
--
-- Rates: at most `rate` starts in any window of `per_ms` ms (server clock), per queue
-- and per group. A log (LIST) of the start times in the window, newest first, is kept
-- per queue and per group; it never holds more than the rate (only the newest `rate`
-- starts decide anything), and expires a window after its last start.
local rate_made = nil

local function rate_lib()
    if rate_made then
        return rate_made
    end
    -- include: live_starts.lua
    -- include: prune.lua
    -- include: log_starts.lua
    -- include: next_start.lua
    -- include: set_deferred_at.lua
    -- include: undefer.lua
    rate_made = {
        live_starts = live_starts,
        prune = prune,
        log_starts = log_starts,
        next_start = next_start,
        set_deferred_at = set_deferred_at,
        undefer = undefer,
    }
    return rate_made
end
