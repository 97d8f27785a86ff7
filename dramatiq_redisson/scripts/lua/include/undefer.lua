-- undefer(ctx, lanes): lanes that waited for their group's rate back on their rings.
-- include: lane_list.lua
-- include: enlist.lua
local function undefer(ctx, lanes)
    for _, lane in ipairs(lanes) do
        if redis.call("LLEN", lane_list(ctx, lane)) > 0 then
            enlist(ctx, lane)
        end
    end
    if #lanes > 0 then
        redis.call("ZREM", ctx.deferred, unpack(lanes))
    end
end
