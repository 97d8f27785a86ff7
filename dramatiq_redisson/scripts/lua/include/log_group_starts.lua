-- log_group_starts(s, group): log the starts a take made in a group (s.group_taken) in
-- its rate log, once.
-- include: group_log.lua
-- include: take_clock.lua
local function log_group_starts(s, group)
    local taken = s.group_taken[group] or 0
    if taken > 0 then
        s.R.log_starts(group_log(s.ctx, group), taken, take_clock(s), s.group_rate, s.per_ms)
        s.group_taken[group] = 0
    end
end
