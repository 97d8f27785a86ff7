-- flow_enable(flow, flag): turn a queue's flow on: its HASH (which flow_on.lua checks) and
-- its flag (the "on}" key that the hot paths read in one MGET; see flow_context.lua).
local function flow_enable(flow, flag)
    redis.call("HSETNX", flow, "on", 1)
    redis.call("SET", flag, 1)
end
