-- log_starts(log, n, now, rate, per_ms): log n starts at now (at most `rate` kept).
-- `per_ms`: the log expires a window after this start (a group's: groups come and go);
-- nil for the queue's, which is one key holding at most `rate` starts.
local function log_starts(log, n, now, rate, per_ms)
    local times = {}
    for i = 1, math.min(n, rate) do
        times[i] = now
    end
    local length = 0
    for i = 1, #times, 1000 do
        length = redis.call("LPUSH", log, unpack(times, i, math.min(#times, i + 999)))
    end
    if length > rate then
        redis.call("LTRIM", log, 0, rate - 1)
    end
    if per_ms then
        redis.call("PEXPIRE", log, per_ms)
    end
end
