-- _wake.lua: a function included by enqueue.lua and transfer.lua (see _script_runner.py), not
-- a script of its own.
--
-- wake(idle, wake_prefix, slots): wake idle consumers until their free slots add up to
-- `slots`, the consumer with the most free slots first (so a burst wakes few consumers).
-- Each one leaves the idle ZSET (consumer token -> free slots) and gets "0" on its own
-- wake channel, wake_prefix .. token .. "}". A consumer that PUBLISH reached nobody for
-- (it died, or its connection is down) counts for nothing and the next one is tried, so
-- a stale entry never swallows a wake-up; it is dropped on the way.
--
-- Returns: how many consumers were woken.
local function wake(idle, wake_prefix, slots)
    local woken = 0
    while slots > 0 do
        local top = redis.call("ZRANGE", idle, -1, -1, "WITHSCORES")
        if not top[1] then
            break
        end
        redis.call("ZREM", idle, top[1])
        if redis.call("PUBLISH", wake_prefix .. top[1] .. "}", "0") > 0 then
            woken = woken + 1
            slots = slots - math.max(1, tonumber(top[2]))
        end
    end
    return woken
end
