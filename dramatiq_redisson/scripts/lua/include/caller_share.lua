-- caller_share(idle, token, own_slots, moved, keep_ties): how many of `moved` messages the
-- calling consumer takes when it places by idle threads (transfer.lua's Placement): one
-- message at a time to whoever can start more, the caller (`own_slots` it can start) or
-- the idle consumer of the registry `idle` that can start the most; a tie goes to the
-- caller with `keep_ties`, else to that consumer. One ZRANGE of the registry's top two.
local function caller_share(idle, token, own_slots, moved, keep_ties)
    local best, other = redis.call("ZRANGE", idle, -2, -1, "WITHSCORES"), 0
    for i = #best - 1, 1, -2 do
        if best[i] ~= token then
            other = tonumber(best[i + 1])
            break
        end
    end
    local left, take = own_slots, 0
    for _ = 1, moved do
        if left > other or (keep_ties and left == other and left > 0) then
            take, left = take + 1, left - 1
        elseif other > 0 then
            other = other - 1
        else
            break
        end
    end
    return take
end
