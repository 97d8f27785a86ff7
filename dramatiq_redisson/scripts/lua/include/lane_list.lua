-- lane_list(ctx, lane): the LIST of a lane's ids (the ready list for PLAIN_LANE).
-- include: record_lane.lua
local function lane_list(ctx, lane)
    if lane == PLAIN_LANE then
        return ctx.ready
    end
    return ctx.lane_prefix .. lane .. "}"
end
