-- history_hour_at(hour): the bit offset of that hour's slot in the hours ring
-- (record_history.lua has the layout).
local HISTORY_HOURS = 744

local function history_hour_at(hour)
    return 16 * (hour % HISTORY_HOURS) * 8
end
