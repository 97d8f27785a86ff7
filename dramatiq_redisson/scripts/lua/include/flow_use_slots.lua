-- flow_use_slots(ctx, lanes): count the concurrency slots that the messages taken from
-- these lanes use: one of the queue's ("inuse") each, and one of its lane's group
-- ("g<group>"; "groups" counts the groups with slots in use). Their acks and nacks give
-- them back (flow_release).
-- include: lane_group.lua
local function flow_use_slots(ctx, lanes)
    if #lanes == 0 then
        return
    end
    redis.call("HINCRBY", ctx.flow, "inuse", #lanes)
    local taken = {}
    for i = 1, #lanes do
        local group = lane_group(lanes[i])
        if group ~= "" then
            taken[group] = (taken[group] or 0) + 1
        end
    end
    for group, n in pairs(taken) do
        if redis.call("HINCRBY", ctx.flow, "g" .. group, n) == n then
            redis.call("HINCRBY", ctx.flow, "groups", 1)
        end
    end
end
