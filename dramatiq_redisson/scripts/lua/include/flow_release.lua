-- flow_release(ctx, records): give back the concurrency slots these fetch records say
-- their messages use (fetch_record.lua); a lane waiting for its group's slot returns to
-- its ring. Returns how many slots were freed.
-- include: record_lane.lua
-- include: lane_group.lua
-- include: decrement.lua
-- include: unblock.lua
local function flow_release(ctx, records)
    local freed, groups = 0, {}
    for i = 1, #records do
        local record = records[i]
        if record and string.find(record, "|held", 1, true) then
            freed = freed + 1
            local group = lane_group(record_lane(record))
            if group ~= "" then
                groups[group] = (groups[group] or 0) + 1
            end
        end
    end
    if freed == 0 then
        return 0
    end
    decrement(ctx.flow, "inuse", freed)
    for group, n in pairs(groups) do
        if decrement(ctx.flow, "g" .. group, n) <= 0 then
            redis.call("HDEL", ctx.flow, "g" .. group)
            decrement(ctx.flow, "groups", 1)
        end
        local unblocked = unblock(ctx, group)
        if unblocked > 0 then
            decrement(ctx.flow, "blocked", unblocked)
        end
    end
    return freed
end
