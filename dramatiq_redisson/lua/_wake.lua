-- _wake.lua: a function included by the scripts that push to a ready queue (enqueue,
-- transfer, requeue, reap, dead, schedule; see _script_runner.py), not a script of its own.
--
-- wake(idle, wake_prefix, slots): wake idle consumers until their free slots add up to
-- `slots`, the consumer with the most free slots first (so a burst wakes few consumers).
-- Each one leaves the idle ZSET (consumer token -> free slots) and gets "0" on its own
-- wake channel, wake_prefix .. token .. "}". A consumer that PUBLISH reached nobody for
-- (it died, or its connection is down) counts for nothing and the next one is tried, so
-- a stale entry never swallows a wake-up; it is dropped on the way.
--
-- One ZPOPMAX per consumer tried (without idle consumers, one in all). ZPOPMAX is newer in
-- the ACL rule than the other commands: a user still on the rule before it gets the
-- ZRANGE and ZREM of the previous release (same outcome).
--
-- Returns: how many consumers were woken.
local function wake_pop(idle)
    local top = redis.pcall("ZPOPMAX", idle)
    if top.err then
        -- Refused (a user on the rule before ZPOPMAX). A key of the wrong type fails the
        -- ZRANGE as it failed before.
        top = redis.call("ZRANGE", idle, -1, -1, "WITHSCORES")
        if top[1] then
            redis.call("ZREM", idle, top[1])
        end
    end
    return top
end

local function wake(idle, wake_prefix, slots)
    local woken = 0
    while slots > 0 do
        local top = wake_pop(idle)
        if not top[1] then
            break
        end
        if redis.call("PUBLISH", wake_prefix .. top[1] .. "}", "0") > 0 then
            woken = woken + 1
            slots = slots - math.max(1, tonumber(top[2]))
        end
    end
    return woken
end
