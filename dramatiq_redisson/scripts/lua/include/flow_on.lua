-- flow_on(ctx): whether the queue's messages go through lanes (EXISTS of its flag, as
-- flow_enable.lua sets it; ctx: flow_context()).
local function flow_on(ctx)
    return redis.call("EXISTS", ctx.flag) == 1
end
