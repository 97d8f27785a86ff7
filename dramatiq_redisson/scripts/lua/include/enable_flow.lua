-- enable_flow(flow, flag): turn the flow on, its HASH and its flag given one by one
-- (offer.lua).
local function enable_flow(flow, flag)
    redis.call("HSETNX", flow, "on", 1)
    redis.call("SET", flag, 1)
end
