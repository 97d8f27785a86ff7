-- next_start(log, rate, per_ms, now): when the log's `rate`-th newest start leaves the
-- window: the next start allowed.
local function next_start(log, rate, per_ms, now)
    local start = tonumber(redis.call("LINDEX", log, rate - 1))
    return start and math.max(now, start + per_ms) or now
end
