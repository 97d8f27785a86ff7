-- add_waiting(by_priority, lane, n): count n ids more (or fewer) waiting in a lane's
-- priority (the plain lane's count is the ready list's length: not counted).
-- include: record_lane.lua
-- include: lane_priority.lua
local function add_waiting(by_priority, lane, n)
    if lane ~= PLAIN_LANE then
        local priority = lane_priority(lane)
        by_priority[priority] = (by_priority[priority] or 0) + n
    end
end
