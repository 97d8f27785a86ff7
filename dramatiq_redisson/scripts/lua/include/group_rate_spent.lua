-- group_rate_spent(s, group): whether a group spent the starts its rate allows now
-- (s.group_left[group], read once, then counted by the take; false without a group rate).
-- include: group_log.lua
-- include: take_clock.lua
local function group_rate_spent(s, group)
    if not s.group_rate or group == "" then
        return false
    end
    local group_left = s.group_left
    if not group_left[group] then
        group_left[group] = s.group_rate - s.R.prune(group_log(s.ctx, group), take_clock(s) - s.per_ms)
    end
    return group_left[group] <= 0
end
