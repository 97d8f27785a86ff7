-- lane_priority(lane): the priority of a lane id "<priority>:<group as hex>".
local function lane_priority(lane)
    return tonumber(string.match(lane, "^(%d+):"))
end
