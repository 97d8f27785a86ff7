-- history_minute_at(minute): the bit offset of that minute's slot in the minutes ring
-- (record_history.lua has the layout).
local HISTORY_MINUTES = 1500

local function history_minute_at(minute)
    return (16 + 16 * (minute % HISTORY_MINUTES)) * 8
end
