-- wake_pop(idle): pop the idle consumer that can start the most (ZPOPMAX; see wake.lua).
-- ZPOPMAX is newer in the ACL rule than the other commands: a user still on the rule
-- before it gets the ZRANGE and ZREM of the previous release (same outcome).
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
