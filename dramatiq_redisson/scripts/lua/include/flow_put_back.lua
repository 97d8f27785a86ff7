-- flow_put_back(ctx, ids, records): ids back at the head of their lanes (read from their
-- fetch records), each lane's ids in the order given: the fetch order from requeue.lua,
-- an ack set's (SMEMBERS) from reap.lua and maintenance.lua, as on a plain queue.
-- include: record_lane.lua
-- include: flow_push.lua
local function flow_put_back(ctx, ids, records)
    local lanes = {}
    for i = 1, #ids do
        lanes[i] = record_lane(records[i])
    end
    flow_push(ctx, ids, lanes, true)
end
