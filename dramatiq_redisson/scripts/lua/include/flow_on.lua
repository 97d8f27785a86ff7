-- flow_on(ctx): whether the queue's messages go through lanes (EXISTS of its flow HASH;
-- ctx: flow_context()).
local function flow_on(ctx)
    return redis.call("EXISTS", ctx.flow) == 1
end
