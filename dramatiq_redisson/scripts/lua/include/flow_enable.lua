-- flow_enable(flag): turn a queue's flow on. Its flag (lane_prefix .. "on}", a STRING, see
-- flow_context.lua) is the one record that the flow is on: the hot paths read it in their
-- MGET, the others with flow_on. (The flow HASH holds the limits, slots and counters.)
local function flow_enable(flag)
    redis.call("SET", flag, 1)
end
