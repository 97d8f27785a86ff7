-- flow_unblock_all(ctx): every lane waiting for its group's concurrency slot or rate back
-- on its ring (limits.lua, when the limits change).
-- include: unblock.lua
-- include: rate_lib.lua
local function flow_unblock_all(ctx)
    for _, field in ipairs(redis.call("HKEYS", ctx.flow)) do
        local group = string.match(field, "^b(%x*)$")
        if group then
            unblock(ctx, group)
        end
    end
    redis.call("HDEL", ctx.flow, "blocked", "rate_at", "rate_waiter")
    if ctx.deferred then
        rate_lib().undefer(ctx, redis.call("ZRANGE", ctx.deferred, 0, -1))
        rate_lib().set_deferred_at(ctx)
    end
end
