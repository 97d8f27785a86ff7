-- group_weight(s, group): how many ids a lane of the group takes per turn (its weight,
-- "w<group>", read once; 1 without weights set). s: flow_take's state.
local function group_weight(s, group)
    if not s.weighted or group == "" then
        return 1
    end
    local weights = s.weights
    if not weights[group] then
        weights[group] = tonumber(redis.call("HGET", s.ctx.flow, "w" .. group) or 1)
    end
    return weights[group]
end
