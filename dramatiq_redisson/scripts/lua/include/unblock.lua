-- unblock(ctx, group): the lanes of `group` waiting for its concurrency slot (block.lua)
-- back on their rings; returns how many.
-- include: lane_list.lua
-- include: enlist.lua
local function unblock(ctx, group)
    local field = "b" .. group
    local blocked = redis.call("HGET", ctx.flow, field)
    if not blocked then
        return 0
    end
    redis.call("HDEL", ctx.flow, field)
    local unblocked = 0
    for lane in string.gmatch(blocked, "%S+") do
        unblocked = unblocked + 1
        if redis.call("LLEN", lane_list(ctx, lane)) > 0 then
            enlist(ctx, lane)
        end
    end
    return unblocked
end
