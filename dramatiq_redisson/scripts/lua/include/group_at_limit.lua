-- group_at_limit(s, group): whether a group uses all its concurrency slots (s: flow_take's
-- state; s.in_use[group] is read once, then counted by the take).
local function group_at_limit(s, group)
    if not s.group_limit or group == "" then
        return false
    end
    local in_use = s.in_use
    if not in_use[group] then
        in_use[group] = tonumber(redis.call("HGET", s.ctx.flow, "g" .. group) or 0)
    end
    return in_use[group] >= s.group_limit
end
