-- _flow.lua: lanes and their rings, for a queue whose `flow` key exists (a priority, a
-- group or a limit was used; see docs/flow-control-design.md). Included by the scripts
-- that push ready messages and by fetch.lua; not a script of its own.
--
-- A lane is the ready list of one (priority, group), its id "<priority>:<group as hex>";
-- lane "0:" is the queue's ready list itself, so a message with neither a priority nor a
-- group goes where it always went. A lane with ids is in its priority's ring (a LIST of
-- lane ids, taken in turn) exactly once; a priority with a non-empty ring is in `levels`
-- (ZSET, score = priority). The plain lane joins ring 0 in the fetch (take), not where
-- ids are pushed onto the ready list: a send or a move of plain messages then needs no
-- look at the flow, and a queue that uses no lanes pays nothing for them.
--
-- The flow's flag is a STRING (lane_prefix .. "on}", _keys.flow_flag), so that the scripts
-- on the hot path read it in the MGET of their other strings: fetch.lua with the pause,
-- transfer.lua with its lease and cursor.
--
-- The flow key is a HASH: "on" = 1 while the queue uses lanes, "plain" = 1 while the plain
-- lane is in ring 0, and "p<priority>" = how
-- many ids wait in the lanes of that priority but the plain one (whose count is the ready
-- list's length): stats.lua reads them with a command per priority, whatever the number of
-- groups. A push or a take changes them with one HINCRBY per priority per call. It also
-- holds the limits ("concurrency", "group_concurrency", "rate", "per_ms", "group_rate"),
-- the slots in use ("inuse", "g<group>", "groups"), the lanes waiting for their group's
-- slot ("b<group>", "blocked"), the rates' sleeper ("rate_at", "rate_waiter") and first
-- deferred lane ("deferred_at"), and the group weights ("w<group>", "weights": how many;
-- "c<lane>": ids left in a weighted lane's turn). <group> is the group name as hex.
--
-- Defined at once (cheap, used on plain paths too):
-- flow_context(ready, flow, levels, lane_of, lane_prefix, ring_prefix, rate_prefix): the
--   keys (rate_prefix: fetch.lua and limits.lua only); a lane's
--   list is lane_prefix .. id .. "}", a ring ring_prefix .. priority .. "}", the flag
--   lane_prefix .. "on}" (the prefixes come from _keys.py in ARGV: they are not keys).
-- flow_on(ctx): whether the queue's messages go through lanes (EXISTS of its HASH).
-- record_lane(record): the lane a fetch record names ("...|lane:<id>"), or PLAIN_LANE.
--
-- Made on first use, as flow_lib().<name> (defining them costs a script call ~6 µs):
-- push(ctx, ids, lanes, at_head): push ids[i] onto lane lanes[i] (nil, "" or "0:": the
--   ready list), at the tail, or at the head (a message put back runs next in its lane).
--   A lane that was empty joins its ring (the plain lane joins in take).
-- take(ctx, count, who): up to count ids, from the highest priority with a lane in its ring;
--   the lanes of one priority in turn, one id per lane per turn (a group's backlog does
--   not delay another group), within the queue's concurrency limits (a lane whose group is
--   at its limit leaves its ring until a slot of its group frees).
--   O(1) commands per id taken: no scan of lanes, rings or ids. A group with a weight
--   w > 1 (field "w<group>", set by limits.lua) takes up to w ids per turn. Within the rate limits
--   (fetch.lua passes the rate prefix): no more than the queue's rate allows now, and a
--   lane whose group spent its rate waits off its ring, in the ZSET ctx.deferred, until
--   its group may start again. `who` names the caller (its consumer token). Returns ids,
--   lanes, then the ms this caller is to sleep before it fetches again (nil: none; the
--   flow's `rate_at` says when the one consumer that sleeps for a rate, `rate_waiter`,
--   wakes) and how many idle consumers' slots to wake now.
-- hold(ctx, lanes): count the slots the messages taken from these lanes hold.
-- record(record, lane): a fetch record that says its message holds slots, and its lane.
-- release(ctx, records): give back the slots these fetch records hold (a lane waiting
--   for its group's slot returns to its ring); returns how many.
-- unblock_all(ctx): every lane waiting for its group's slot or rate back on its ring.
-- live_starts(log, cutoff): how many starts of a rate log are after cutoff (and its length).
-- enable(ctx): turn the flow on (its HASH and its flag); enable_keys(flow, flag): the
--   same with the keys given one by one (offer.lua).
-- put_back(ctx, ids, records): ids back at the head of their lanes (read from their fetch
--   records), each lane's ids in the order given: the fetch order from requeue.lua, an
--   ack set's (SMEMBERS) from reap.lua and maintenance.lua, as on a plain queue.

local PLAIN_LANE = "0:"

local function flow_context(ready, flow, levels, lane_of, lane_prefix, ring_prefix, rate_prefix)
    return {
        ready = ready, flow = flow, levels = levels, lane_of = lane_of,
        lane_prefix = lane_prefix, ring_prefix = ring_prefix,
        flag = lane_prefix and (lane_prefix .. "on}"),
        rate_prefix = rate_prefix, -- fetch.lua and limits.lua only (rates, below)
        deferred = rate_prefix and (rate_prefix .. "deferred}"),
    }
end

local function flow_on(ctx)
    return redis.call("EXISTS", ctx.flow) == 1
end

local function record_lane(record)
    return record and string.match(record, "|lane:(%d+:%x*)$") or PLAIN_LANE
end

-- The rest is made on first use (flow_lib()): defining these functions costs a script call
-- about 6 µs, which a queue without lanes must not pay.
local flow_lib_made = nil

local function flow_lib()
    if flow_lib_made then
        return flow_lib_made
    end
    local function lane_list(ctx, lane)
        if lane == PLAIN_LANE then
            return ctx.ready
        end
        return ctx.lane_prefix .. lane .. "}"
    end

    local function lane_priority(lane)
        return tonumber(string.match(lane, "^(%d+):"))
    end

    local function ring_list(ctx, priority)
        return ctx.ring_prefix .. priority .. "}"
    end

    local function count_waiting(flow, by_priority)
        for priority, n in pairs(by_priority) do
            redis.call("HINCRBY", flow, "p" .. priority, n)
        end
    end

    local function add_waiting(by_priority, lane, n)
        if lane ~= PLAIN_LANE then
            local priority = lane_priority(lane)
            by_priority[priority] = (by_priority[priority] or 0) + n
        end
    end

    local function enlist(ctx, lane)
        local priority = lane_priority(lane)
        redis.call("RPUSH", ring_list(ctx, priority), lane)
        redis.call("ZADD", ctx.levels, priority, priority)
    end

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

    local function lane_group(lane)
        return string.match(lane, "^%d+:(%x*)$") or ""
    end

    local function block(ctx, group, lane)
        local field = "b" .. group
        local blocked = redis.call("HGET", ctx.flow, field)
        redis.call("HSET", ctx.flow, field, blocked and (blocked .. " " .. lane) or lane)
        redis.call("HINCRBY", ctx.flow, "blocked", 1)
    end

    -- Rates: at most `rate` starts in any window of `per_ms` ms (server clock), per queue
    -- and per group. A log (LIST) of the start times in the window, newest first, is kept
    -- per queue and per group; it never holds more than the rate (only the newest `rate`
    -- starts decide anything), and expires a window after its last start. Made on first
    -- use too (rate_lib()): a fetch of a queue without rates defines none of it.
    local rate_made = nil
    local function rate_lib()
        if rate_made then
            return rate_made
        end
        local function live_starts(log, cutoff)
            -- How many of the log's starts are after `cutoff`, and its length (a binary
            -- search: O(log n) reads, and one when none left the window).
            local n = redis.call("LLEN", log)
            if n == 0 or tonumber(redis.call("LINDEX", log, -1)) > cutoff then
                return n, n
            end
            local lo, hi = 0, n - 1 -- the first index whose start is at or before the cutoff
            while lo < hi do
                local mid = math.floor((lo + hi) / 2)
                if tonumber(redis.call("LINDEX", log, mid)) > cutoff then
                    lo = mid + 1
                else
                    hi = mid
                end
            end
            return lo, n
        end

        local function prune(log, cutoff)
            -- Drop the starts that left the window; returns how many are left.
            local live, n = live_starts(log, cutoff)
            if live == 0 and n > 0 then
                redis.call("LTRIM", log, 1, 0) -- (empty: the key goes)
            elseif live < n then
                redis.call("LTRIM", log, 0, live - 1)
            end
            return live
        end

        local function log_starts(log, n, now, rate, per_ms)
            -- `per_ms`: the log expires a window after this start (a group's: groups come
            -- and go); nil for the queue's, which is one key holding at most `rate` starts.
            local times = {}
            for i = 1, math.min(n, rate) do
                times[i] = now
            end
            local length = 0
            for i = 1, #times, 1000 do
                length = redis.call("LPUSH", log, unpack(times, i, math.min(#times, i + 999)))
            end
            if length > rate then
                redis.call("LTRIM", log, 0, rate - 1)
            end
            if per_ms then
                redis.call("PEXPIRE", log, per_ms)
            end
        end

        local function next_start(log, rate, per_ms, now)
            -- When the log's `rate`-th newest start leaves the window: the next start allowed.
            local start = tonumber(redis.call("LINDEX", log, rate - 1))
            return start and math.max(now, start + per_ms) or now
        end

        local function set_deferred_at(ctx)
            -- The flow's `deferred_at`: when the first lane waiting for its group's rate goes.
            local head = redis.call("ZRANGE", ctx.deferred, 0, 0, "WITHSCORES")
            if head[1] then
                redis.call("HSET", ctx.flow, "deferred_at", head[2])
                return tonumber(head[2])
            end
            redis.call("HDEL", ctx.flow, "deferred_at")
            return nil
        end

        local function undefer(ctx, lanes)
            for _, lane in ipairs(lanes) do
                if redis.call("LLEN", lane_list(ctx, lane)) > 0 then
                    enlist(ctx, lane)
                end
            end
            if #lanes > 0 then
                redis.call("ZREM", ctx.deferred, unpack(lanes))
            end
        end

        rate_made = {
            live_starts = live_starts,
            prune = prune,
            log_starts = log_starts,
            next_start = next_start,
            set_deferred_at = set_deferred_at,
            undefer = undefer,
        }
        return rate_made
    end

    local function never()
        return false
    end

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
        local asked = count
        local now = nil
        local function clock() -- the server's, read once and only when a rate needs it
            if not now then
                local t = redis.call("TIME")
                now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
            end
            return now
        end
        local conc_left = limit and math.max(0, limit - (tonumber(limits[3]) or 0)) or math.huge
        count = math.min(count, conc_left)
        local queue_log, rate_left = nil, math.huge
        if rate then
            queue_log = ctx.rate_prefix .. "q}"
            rate_left = math.max(0, rate - R.prune(queue_log, clock() - per_ms))
            count = math.min(count, rate_left)
        end
        -- Lanes whose group may start again: back on their rings (at most 100 a fetch).
        local released = false
        if deferred_at and deferred_at <= clock() then
            local due = redis.call("ZRANGEBYSCORE", ctx.deferred, "-inf", clock(), "LIMIT", 0, 100)
            R.undefer(ctx, due)
            released = #due > 0
            deferred_at = R.set_deferred_at(ctx)
        end
        if count > 0 and not limits[4] and redis.call("LLEN", ctx.ready) > 0 then
            enlist(ctx, PLAIN_LANE) -- plain ids were pushed since its last turn
            redis.call("HSET", ctx.flow, "plain", 1)
        end
        local in_use = {} -- group -> its slots in use (read once, then counted here)
        local function at_limit(group)
            if not group_limit or group == "" then
                return false
            end
            if not in_use[group] then
                in_use[group] = tonumber(redis.call("HGET", ctx.flow, "g" .. group) or 0)
            end
            return in_use[group] >= group_limit
        end
        -- Weighted turns (only with weights set): a lane of a group of weight w takes up to
        -- w ids per turn (it stays at its ring's head, "c<lane>" = ids left in its turn).
        local weighted, weights = tonumber(limits[11] or 0) > 0, {}
        local function weight_of(group)
            if not weighted or group == "" then
                return 1
            end
            if not weights[group] then
                weights[group] = tonumber(redis.call("HGET", ctx.flow, "w" .. group) or 1)
            end
            return weights[group]
        end
        local function end_turn(group, lane)
            if weight_of(group) > 1 then
                redis.call("HDEL", ctx.flow, "c" .. lane)
            end
        end
        local function next_turn(group, lane, ring)
            local weight = weight_of(group)
            if weight > 1 then
                local credit = (tonumber(redis.call("HGET", ctx.flow, "c" .. lane)) or weight) - 1
                if credit > 0 then
                    redis.call("HSET", ctx.flow, "c" .. lane, credit)
                    return redis.call("LPUSH", ring, lane) -- the rest of its turn
                end
                redis.call("HDEL", ctx.flow, "c" .. lane)
            end
            return redis.call("RPUSH", ring, lane) -- its next turn
        end
        -- A group's rate (only with one set): group -> starts its rate allows, starts taken.
        local rate_spent, defer, group_left, group_taken = never, nil, {}, {}
        local deferred_moved = false
        local function group_log(group)
            return ctx.rate_prefix .. "g" .. group .. "}"
        end
        local function log_group(group)
            if (group_taken[group] or 0) > 0 then
                R.log_starts(group_log(group), group_taken[group], clock(), group_rate, per_ms)
                group_taken[group] = 0
            end
        end
        if group_rate then
            rate_spent = function(group)
                if group == "" then
                    return false
                end
                if not group_left[group] then
                    group_left[group] = group_rate - R.prune(group_log(group), clock() - per_ms)
                end
                return group_left[group] <= 0
            end
            defer = function(group, lane)
                -- Off its ring until its group may start again (its starts so far logged first).
                log_group(group)
                local at = R.next_start(group_log(group), group_rate, per_ms, clock())
                redis.call("ZADD", ctx.deferred, at, lane)
                if not deferred_at or at < deferred_at then
                    deferred_at = at
                    deferred_moved = true
                end
            end
        end
        local function held_back(group, lane)
            -- A lane whose group is at its limit, or spent its rate, leaves its ring (its
            -- turn ends): back when a slot of its group frees, or when it may start again.
            if at_limit(group) then
                end_turn(group, lane)
                block(ctx, group, lane)
            elseif rate_spent(group) then
                end_turn(group, lane)
                defer(group, lane)
            else
                return false
            end
            return true
        end
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
                if not held_back(group, lane) then
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
                            if not held_back(group, lane) then
                                left = next_turn(group, lane, ring)
                            end
                        elseif lane == PLAIN_LANE then
                            redis.call("HDEL", ctx.flow, "plain") -- off the ring until it has ids
                        else
                            end_turn(group, lane)
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
            log_group(group)
        end
        if deferred_moved then
            redis.call("HSET", ctx.flow, "deferred_at", deferred_at)
        end
        -- Waiting for a rate: the next start allowed (the queue's, or a deferred lane's).
        local more_known = nil
        local function more() -- ready ids in turn (read only when it decides something)
            if more_known == nil then
                more_known = redis.call("ZCARD", ctx.levels) > 0 or redis.call("LLEN", ctx.ready) > 0
            end
            return more_known
        end
        local wait_until = deferred_at
        if rate then
            rate_left = rate_left - #ids
            if #ids > 0 then
                R.log_starts(queue_log, #ids, clock(), rate, nil)
            end
            if rate_left <= 0 and (deferred_at or more()) then
                wait_until = R.next_start(queue_log, rate, per_ms, clock())
            end
        end
        -- One consumer sleeps until then (rate_at), not every idle one: the fetch it makes
        -- then wakes as many others as the starts now allowed need (wake_slots).
        local wait_ms = nil
        local waiter_due = rate_at and rate_at <= clock()
        local sleeper = who and who ~= "" and limits[10] == who -- it asks again before its time
        if wait_until and #ids < asked and (not rate_at or waiter_due or wait_until < rate_at or sleeper) then
            if wait_until ~= rate_at or not sleeper then
                redis.call("HSET", ctx.flow, "rate_at", wait_until, "rate_waiter", who or "")
            end
            wait_ms = math.max(1, wait_until - clock())
        elseif waiter_due then
            redis.call("HDEL", ctx.flow, "rate_at", "rate_waiter")
        end
        local wake_slots = 0
        if (waiter_due or released) and #ids == asked and more() then
            wake_slots = math.min(rate_left, conc_left - #ids, 1000000)
        end
        return ids, lanes, wait_ms, wake_slots
    end

    local function flow_hold(ctx, lanes)
        if #lanes == 0 then
            return
        end
        redis.call("HINCRBY", ctx.flow, "inuse", #lanes)
        local taken = {}
        for i = 1, #lanes do
            local group = lane_group(lanes[i])
            if group ~= "" then
                taken[group] = (taken[group] or 0) + 1
            end
        end
        for group, n in pairs(taken) do
            if redis.call("HINCRBY", ctx.flow, "g" .. group, n) == n then
                redis.call("HINCRBY", ctx.flow, "groups", 1)
            end
        end
    end

    local function enable_flow(flow, flag)
        redis.call("HSETNX", flow, "on", 1)
        redis.call("SET", flag, 1)
    end

    local function flow_enable(ctx)
        enable_flow(ctx.flow, ctx.flag)
    end

    local function fetch_record(record, lane)
        -- "|held": the message holds a slot of its queue (and of its lane's group, if any)
        if lane and lane ~= PLAIN_LANE then
            return record .. "|held|lane:" .. lane
        end
        return record .. "|held"
    end

    local function decrement(flow, field, n)
        -- A count never goes below the truth: one that would is 0.
        local left = redis.call("HINCRBY", flow, field, -n)
        if left < 0 then
            redis.call("HSET", flow, field, 0)
        end
        return left
    end

    local function unblock(ctx, group)
        -- The lanes of `group` waiting for its slot back on their rings; returns how many.
        local field = "b" .. group
        local blocked = redis.call("HGET", ctx.flow, field)
        if not blocked then
            return 0
        end
        redis.call("HDEL", ctx.flow, field)
        local unblocked = 0
        for lane in string.gmatch(blocked, "%S+") do
            unblocked = unblocked + 1
            if redis.call("LLEN", lane_list(ctx, lane)) > 0 then
                enlist(ctx, lane)
            end
        end
        return unblocked
    end

    local function flow_release(ctx, records)
        local freed, groups = 0, {}
        for i = 1, #records do
            local record = records[i]
            if record and string.find(record, "|held", 1, true) then
                freed = freed + 1
                local group = lane_group(record_lane(record))
                if group ~= "" then
                    groups[group] = (groups[group] or 0) + 1
                end
            end
        end
        if freed == 0 then
            return 0
        end
        decrement(ctx.flow, "inuse", freed)
        for group, n in pairs(groups) do
            if decrement(ctx.flow, "g" .. group, n) <= 0 then
                redis.call("HDEL", ctx.flow, "g" .. group)
                decrement(ctx.flow, "groups", 1)
            end
            local unblocked = unblock(ctx, group)
            if unblocked > 0 then
                decrement(ctx.flow, "blocked", unblocked)
            end
        end
        return freed
    end

    local function flow_unblock_all(ctx)
        for _, field in ipairs(redis.call("HKEYS", ctx.flow)) do
            local group = string.match(field, "^b(%x*)$")
            if group then
                unblock(ctx, group)
            end
        end
        redis.call("HDEL", ctx.flow, "blocked", "rate_at", "rate_waiter")
        if ctx.deferred then
            rate_lib().undefer(ctx, redis.call("ZRANGE", ctx.deferred, 0, -1))
            rate_lib().set_deferred_at(ctx)
        end
    end

    local function flow_put_back(ctx, ids, records)
        local lanes = {}
        for i = 1, #ids do
            lanes[i] = record_lane(records[i])
        end
        flow_push(ctx, ids, lanes, true)
    end

    flow_lib_made = {
        push = flow_push,
        take = flow_take,
        hold = flow_hold,
        enable = flow_enable,
        enable_keys = enable_flow,
        record = fetch_record,
        release = flow_release,
        unblock_all = flow_unblock_all,
        put_back = flow_put_back,
        live_starts = function(log, cutoff)
            return rate_lib().live_starts(log, cutoff)
        end,
    }
    return flow_lib_made
end
