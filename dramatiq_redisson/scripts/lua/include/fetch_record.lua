-- fetch_record(record, lane): a fetch record that says its message uses concurrency slots
-- (of its queue, and of its lane's group, if any), and its lane: "<record>|held" or
-- "<record>|held|lane:<lane>" ("|held" is the stored marker's name, read by flow_release;
-- records already stored keep it, so it stays).
-- include: record_lane.lua
local function fetch_record(record, lane)
    if lane and lane ~= PLAIN_LANE then
        return record .. "|held|lane:" .. lane
    end
    return record .. "|held"
end
