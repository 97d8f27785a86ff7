-- count_waiting(flow, by_priority): add each priority's change of waiting ids (from
-- add_waiting) to its "p<priority>" count: one HINCRBY per priority per call.
local function count_waiting(flow, by_priority)
    for priority, n in pairs(by_priority) do
        redis.call("HINCRBY", flow, "p" .. priority, n)
    end
end
