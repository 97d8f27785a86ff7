-- set_deferred_at(ctx): the flow's `deferred_at`: when the first lane waiting for its
-- group's rate goes.
local function set_deferred_at(ctx)
    local head = redis.call("ZRANGE", ctx.deferred, 0, 0, "WITHSCORES")
    if head[1] then
        redis.call("HSET", ctx.flow, "deferred_at", head[2])
        return tonumber(head[2])
    end
    redis.call("HDEL", ctx.flow, "deferred_at")
    return nil
end
