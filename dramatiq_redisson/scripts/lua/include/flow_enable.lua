-- flow_enable(ctx): turn the flow on (its HASH and its flag).
-- include: enable_flow.lua
local function flow_enable(ctx)
    enable_flow(ctx.flow, ctx.flag)
end
