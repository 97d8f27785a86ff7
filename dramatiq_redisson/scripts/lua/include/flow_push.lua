-- flow_push(ctx, ids, lanes, at_head): push ids[i] onto lane lanes[i] (nil, "" or "0:": the
-- ready list), at the tail, or at the head (a message put back runs next in its lane).
-- A lane that was empty joins its ring (the plain lane joins in take).
-- include: record_lane.lua
-- include: lane_list.lua
-- include: enlist.lua
-- include: add_waiting.lua
-- include: count_waiting.lua
local function flow_push(ctx, ids, lanes, at_head)
    local waiting = {}
    if at_head then
        -- Last first, so that each lane's ids end at its head in the order given.
        for i = #ids, 1, -1 do
            local lane = lanes[i] or PLAIN_LANE
            if lane == "" then
                lane = PLAIN_LANE
            end
            if redis.call("LPUSH", lane_list(ctx, lane), ids[i]) == 1 and lane ~= PLAIN_LANE then
                enlist(ctx, lane)
            end
            add_waiting(waiting, lane, 1)
        end
        count_waiting(ctx.flow, waiting)
        return
    end
    local i = 1
    while i <= #ids do
        -- A run of ids of one lane in one RPUSH (order kept within a lane).
        local lane = lanes[i]
        if not lane or lane == "" then
            lane = PLAIN_LANE
        end
        local j = i
        while j < #ids and (lanes[j + 1] or PLAIN_LANE) == lane do
            j = j + 1
        end
        if redis.call("RPUSH", lane_list(ctx, lane), unpack(ids, i, j)) == j - i + 1 and lane ~= PLAIN_LANE then
            enlist(ctx, lane) -- it was empty (the plain lane joins in the fetch)
        end
        add_waiting(waiting, lane, j - i + 1)
        i = j + 1
    end
    count_waiting(ctx.flow, waiting)
end
