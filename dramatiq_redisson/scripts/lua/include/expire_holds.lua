-- expire_holds(holds, throttle_copies, now_ms): both keys expire when their latest window
-- ends, so windows nobody touches again never outlive it.
local function expire_holds(holds, throttle_copies, now_ms)
    local last = redis.call("ZRANGE", holds, -1, -1, "WITHSCORES")
    if last[1] then
        local left = math.max(1, tonumber(last[2]) - now_ms)
        redis.call("PEXPIRE", holds, left)
        redis.call("PEXPIRE", throttle_copies, left)
    end
end
