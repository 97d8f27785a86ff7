-- leaves_ring(s, group, lane): a lane whose group is at its concurrency limit, or spent its
-- rate, leaves its ring (its turn ends): back when a slot of its group frees, or when it
-- may start again. Returns whether it left.
-- include: group_at_limit.lua
-- include: end_turn.lua
-- include: block.lua
-- include: group_rate_spent.lua
-- include: defer_lane.lua
local function leaves_ring(s, group, lane)
    if group_at_limit(s, group) then
        end_turn(s, group, lane)
        block(s.ctx, group, lane)
    elseif group_rate_spent(s, group) then
        end_turn(s, group, lane)
        defer_lane(s, group, lane)
    else
        return false
    end
    return true
end
