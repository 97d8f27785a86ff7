-- enlist(ctx, lane): a lane joins its priority's ring, and the priority joins `levels`.
-- include: lane_priority.lua
-- include: ring_list.lua
local function enlist(ctx, lane)
    local priority = lane_priority(lane)
    redis.call("RPUSH", ring_list(ctx, priority), lane)
    redis.call("ZADD", ctx.levels, priority, priority)
end
