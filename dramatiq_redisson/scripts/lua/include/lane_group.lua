-- lane_group(lane): the group (as hex; "" for none) of a lane id "<priority>:<group as hex>".
local function lane_group(lane)
    return string.match(lane, "^%d+:(%x*)$") or ""
end
