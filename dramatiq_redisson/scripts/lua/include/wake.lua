-- wake: included by the scripts that push to a ready queue (enqueue, transfer, requeue,
-- reap, dead, schedule).
--
-- wake(idle, wake_prefix, slots[, except]): wake idle consumers until what they can start
-- adds up to `slots`, the consumer that can start the most first: so a message goes to
-- the process with the most idle worker threads, and a burst wakes few consumers. The idle
-- ZSET maps a consumer token to how many messages it can start now (its idle threads,
-- within its free prefetch); 0: it listens, but every thread is busy (its ack raises the
-- score again, see ack.lua). Each one woken leaves the ZSET and gets "0" on its own wake
-- channel, wake_prefix .. token .. "}". A consumer that PUBLISH reached nobody for (it
-- died, or its connection is down) counts for nothing and the next one is tried, so a
-- stale entry never swallows a wake-up; it is dropped on the way. A top score of 0 ends
-- the round (put back: nobody can start anything now; the first ack with messages
-- waiting wakes its own consumer). `except`, a token: popped but not woken, and listed
-- again as it was when the round ends (the caller then writes its own entry).
--
-- One ZPOPMAX per consumer tried (wake_pop; without idle consumers, one in all; with
-- only busy ones, a ZADD more).
--
-- Returns: how many consumers were woken.
-- include: wake_pop.lua
local function wake(idle, wake_prefix, slots, except)
    local woken, skipped = 0, nil
    while slots > 0 do
        local top = wake_pop(idle)
        if not top[1] then
            break
        end
        local score = tonumber(top[2])
        if top[1] == except then
            skipped = top[2]
        elseif score <= 0 then
            redis.call("ZADD", idle, score, top[1]) -- busy: listed again, not woken
            break
        elseif redis.call("PUBLISH", wake_prefix .. top[1] .. "}", "0") > 0 then
            woken = woken + 1
            slots = slots - score
        end
    end
    if skipped then
        redis.call("ZADD", idle, skipped, except) -- as it was: the caller rewrites it if it will
    end
    return woken
end
