-- block(ctx, group, lane): a lane whose group is at its concurrency limit waits off its
-- ring, in the flow's "b<group>" list, until a slot of its group frees (unblock.lua).
local function block(ctx, group, lane)
    local field = "b" .. group
    local blocked = redis.call("HGET", ctx.flow, field)
    redis.call("HSET", ctx.flow, field, blocked and (blocked .. " " .. lane) or lane)
    redis.call("HINCRBY", ctx.flow, "blocked", 1)
end
