-- trim_holds(holds, throttle_copies, now_ms): drop up to HOLD_TRIM throttle windows that
-- ended (from holds and from throttle_copies, the copies of the messages that ran in
-- them: see dedupe_split.lua).
--
-- Ended throttle windows one call trims at most (bounded work). transfer.lua trims each
-- time it adds windows, so ended ones never outnumber what one call trims by much, and
-- both keys expire with the latest window, which removes whatever is left.
local HOLD_TRIM = 16

local function trim_holds(holds, throttle_copies, now_ms)
    local ended = redis.call("ZRANGEBYSCORE", holds, "-inf", now_ms, "LIMIT", 0, HOLD_TRIM)
    if #ended > 0 then
        redis.call("ZREM", holds, unpack(ended))
        redis.call("HDEL", throttle_copies, unpack(ended))
    end
end
