-- live_starts(log, cutoff): how many of a rate log's starts are after `cutoff`, and its
-- length (a binary search: O(log n) reads, and one when none left the window).
local function live_starts(log, cutoff)
    local n = redis.call("LLEN", log)
    if n == 0 or tonumber(redis.call("LINDEX", log, -1)) > cutoff then
        return n, n
    end
    local lo, hi = 0, n - 1 -- the first index whose start is at or before the cutoff
    while lo < hi do
        local mid = math.floor((lo + hi) / 2)
        if tonumber(redis.call("LINDEX", log, mid)) > cutoff then
            lo = mid + 1
        else
            hi = mid
        end
    end
    return lo, n
end
