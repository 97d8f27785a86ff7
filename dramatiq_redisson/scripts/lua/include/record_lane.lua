-- record_lane(record): the lane a fetch record names ("...|lane:<id>"), or PLAIN_LANE.
--
-- A lane is the ready list of one (priority, group), its id "<priority>:<group as hex>";
-- PLAIN_LANE, "0:", is the queue's ready list itself, so a message with neither a priority
-- nor a group goes where it always went (flow_context.lua has the whole scheme).
local PLAIN_LANE = "0:"

local function record_lane(record)
    return record and string.match(record, "|lane:(%d+:%x*)$") or PLAIN_LANE
end
