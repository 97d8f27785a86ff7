-- prune(log, cutoff): drop the starts that left the window; returns how many are left.
-- include: live_starts.lua
local function prune(log, cutoff)
    local live, n = live_starts(log, cutoff)
    if live == 0 and n > 0 then
        redis.call("LTRIM", log, 1, 0) -- (empty: the key goes)
    elseif live < n then
        redis.call("LTRIM", log, 0, live - 1)
    end
    return live
end
