-- flow_take(ctx, count, who): up to count ids, from the highest priority with a lane in
-- its ring; the lanes of one priority in turn, one id per lane per turn (a group's backlog
-- does not delay another group), within the queue's concurrency limits (a lane whose group
-- is at its limit leaves its ring until a slot of its group frees).
--   O(1) commands per id taken: no scan of lanes, rings or ids. A group with a weight
--   w > 1 (field "w<group>", set by limits.lua) takes up to w ids per turn. Within the
--   rate limits (fetch.lua passes the rate prefix): no more than the queue's rate allows
--   now, and a lane whose group spent its rate waits off its ring, in the ZSET
--   ctx.deferred, until its group may start again. `who` names the caller (its consumer
--   token). Returns ids, lanes, then the ms this caller is to sleep before it fetches
--   again (nil: none; the flow's `rate_at` says when the one consumer that sleeps for a
--   rate, `rate_waiter`, wakes) and how many idle consumers' slots to wake now.
--
-- The take's state `s`, which its helpers (take_lib.lua) read and write: ctx, now (the
-- server clock once read), R (rate_lib(), when rated), per_ms, group_limit, in_use
-- (group -> its slots in use, read once then counted here), weighted, weights,
-- group_rate, group_left and group_taken (group -> starts its rate allows, starts taken),
-- deferred_at, deferred_moved, more_known.
-- include: record_lane.lua
-- include: lane_group.lua
-- include: lane_list.lua
-- include: ring_list.lua
-- include: enlist.lua
-- include: add_waiting.lua
-- include: count_waiting.lua
-- include: rate_lib.lua
-- include: take_lib.lua
local function flow_take(ctx, count, who)
    local ids, lanes, waiting = {}, {}, {}
    local limits = redis.call(
        "HMGET", ctx.flow, "concurrency", "group_concurrency", "inuse", "plain",
        "rate", "group_rate", "per_ms", "deferred_at", "rate_at", "rate_waiter", "weights"
    )
    local limit, group_limit = tonumber(limits[1]), tonumber(limits[2])
    local per_ms = ctx.rate_prefix and tonumber(limits[7])
    local rate = per_ms and tonumber(limits[5])
    local group_rate = per_ms and tonumber(limits[6])
    local deferred_at = ctx.rate_prefix and tonumber(limits[8])
    local rate_at = ctx.rate_prefix and tonumber(limits[9])
    local rated = rate or group_rate or deferred_at or rate_at
    local R = rated and rate_lib()
    local T = take_lib()
    local s = {
        ctx = ctx, now = nil, R = R, per_ms = per_ms,
        group_limit = group_limit, in_use = {},
        weighted = tonumber(limits[11] or 0) > 0, weights = {},
        group_rate = group_rate, group_left = {}, group_taken = {},
        deferred_at = deferred_at, deferred_moved = false, more_known = nil,
    }
    local clock, leaves_ring, next_turn, end_turn = T.take_clock, T.leaves_ring, T.next_turn, T.end_turn
    local asked = count
    local conc_left = limit and math.max(0, limit - (tonumber(limits[3]) or 0)) or math.huge
    count = math.min(count, conc_left)
    local queue_log, rate_left = nil, math.huge
    if rate then
        queue_log = ctx.rate_prefix .. "q}"
        rate_left = math.max(0, rate - R.prune(queue_log, clock(s) - per_ms))
        count = math.min(count, rate_left)
    end
    -- Lanes whose group may start again: back on their rings (at most 100 a fetch).
    local released = false
    if s.deferred_at and s.deferred_at <= clock(s) then
        local due = redis.call("ZRANGEBYSCORE", ctx.deferred, "-inf", clock(s), "LIMIT", 0, 100)
        R.undefer(ctx, due)
        released = #due > 0
        s.deferred_at = R.set_deferred_at(ctx)
    end
    if count > 0 and not limits[4] and redis.call("LLEN", ctx.ready) > 0 then
        enlist(ctx, PLAIN_LANE) -- plain ids were pushed since its last turn
        redis.call("HSET", ctx.flow, "plain", 1)
    end
    local in_use, group_left, group_taken = s.in_use, s.group_left, s.group_taken
    while #ids < count do
        local top = redis.call("ZRANGE", ctx.levels, -1, -1)[1] -- the highest priority
        if not top then
            break
        end
        local ring = ring_list(ctx, top)
        local lane = redis.call("LPOP", ring)
        local left = 0
        if lane then
            local group = lane_group(lane)
            if not leaves_ring(s, group, lane) then
                local list = lane_list(ctx, lane)
                local id = redis.call("LPOP", list)
                if id then
                    ids[#ids + 1] = id
                    lanes[#lanes + 1] = lane
                    add_waiting(waiting, lane, -1)
                    if group ~= "" and in_use[group] then
                        in_use[group] = in_use[group] + 1
                    end
                    if group ~= "" and group_rate then
                        group_left[group] = group_left[group] - 1
                        group_taken[group] = (group_taken[group] or 0) + 1
                    end
                    if redis.call("LLEN", list) > 0 then
                        if not leaves_ring(s, group, lane) then
                            left = next_turn(s, group, lane, ring)
                        end
                    elseif lane == PLAIN_LANE then
                        redis.call("HDEL", ctx.flow, "plain") -- off the ring until it has ids
                    else
                        end_turn(s, group, lane)
                    end
                elseif lane == PLAIN_LANE then
                    redis.call("HDEL", ctx.flow, "plain")
                end
            end
        end
        if left == 0 and redis.call("LLEN", ring) == 0 then
            redis.call("ZREM", ctx.levels, top)
        end
    end
    count_waiting(ctx.flow, waiting)
    if not rated then
        return ids, lanes, nil, 0
    end
    for group in pairs(group_taken) do
        T.log_group_starts(s, group)
    end
    if s.deferred_moved then
        redis.call("HSET", ctx.flow, "deferred_at", s.deferred_at)
    end
    -- Waiting for a rate: the next start allowed (the queue's, or a deferred lane's).
    local more = T.more_waiting
    local wait_until = s.deferred_at
    if rate then
        rate_left = rate_left - #ids
        if #ids > 0 then
            R.log_starts(queue_log, #ids, clock(s), rate, nil)
        end
        if rate_left <= 0 and (s.deferred_at or more(s)) then
            wait_until = R.next_start(queue_log, rate, per_ms, clock(s))
        end
    end
    -- One consumer sleeps until then (rate_at), not every idle one: the fetch it makes
    -- then wakes as many others as the starts now allowed need (wake_slots).
    local wait_ms = nil
    local waiter_due = rate_at and rate_at <= clock(s)
    local sleeper = who and who ~= "" and limits[10] == who -- it asks again before its time
    if wait_until and #ids < asked and (not rate_at or waiter_due or wait_until < rate_at or sleeper) then
        if wait_until ~= rate_at or not sleeper then
            redis.call("HSET", ctx.flow, "rate_at", wait_until, "rate_waiter", who or "")
        end
        wait_ms = math.max(1, wait_until - clock(s))
    elseif waiter_due then
        redis.call("HDEL", ctx.flow, "rate_at", "rate_waiter")
    end
    local wake_slots = 0
    if (waiter_due or released) and #ids == asked and more(s) then
        wake_slots = math.min(rate_left, conc_left - #ids, 1000000)
    end
    return ids, lanes, wait_ms, wake_slots
end
