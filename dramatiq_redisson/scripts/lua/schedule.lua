-- schedule: change a periodic actor's schedule, atomically (see periodic/_schedules.py).
--
-- A schedule is a chain of delayed messages: exactly one tick of it is scheduled at a
-- time, in the queue's ZSET, and transfer.lua, when it moves that tick, schedules the next
-- one in the same step. The next tick times come from the client (cron needs a time zone
-- database), a few dozen ahead, in KEYS[3]'s "<name>|t" field.
--
-- KEYS[1]  schedules      HASH  redisson_delay_queue_schedules:{N}      name -> definition (JSON)
-- KEYS[2]  chains         HASH  redisson_delay_queue_chains:{N}         name -> member of the scheduled tick
-- KEYS[3]  schedule_state HASH  redisson_delay_queue_schedule_state:{N} "<name>|t" upcoming ticks (epoch ms,
--                comma-separated; "<tick>+<jitter ms>" when the tick is due later than its
--                time), "|r" last tick run, "|l" its lateness (ms), "|s" the first tick not
--                run while the chain waits to be resumed, "|p" "1": paused; policies (issue
--                50): "|o" "skip" (overlap), "|u" the redis message id of the run last
--                enqueued (with "skip"), "|m" the limit of runs, "|n" the runs enqueued,
--                "|k" the ticks skipped, "|d" the ticks dropped (not started by their
--                deadline), "|e" why the schedule ended ("end": its window; "limit"), "|g"
--                the latest tick started (with a deadline)
-- KEYS[4]  timeout_zset   ZSET  redisson_delay_queue_timeout:{N}        member -> due time (epoch ms)
-- KEYS[5]  backup_list    LIST  redisson_delay_queue:{N}                backup list
-- KEYS[6]  payloads       HASH  redisson_delay_queue_msgs:{N}           message id -> sort key .. payload
-- KEYS[7]  channel        CHANNEL redisson_delay_queue_channel:{N}      a new earliest due time
-- KEYS[8]  ready          LIST  <ns>:<queue>                            ready queue
-- KEYS[9]  ready_msgs     HASH  <ns>:<queue>.msgs                       redis message id -> encoded message
-- KEYS[10] idle           ZSET  redisson_delay_queue_idle:{N}           idle consumers (see wake.lua)
--
-- ARGV[1]  op  the operation
-- ARGV[2]  name  the schedule's name
-- ARGV[3..] rest  per operation:
--
-- "start": (re)start the chain at a tick, replacing the scheduled tick if there is one,
--          only if a guard holds: ARGV[3] its kind, ARGV[4] the expected value:
--            "def": the stored definition is ARGV[4] ("": there is none);
--            "stall": "|s" is ARGV[4] (the chain waits to be resumed from that tick);
--            "paused": the schedule is paused (ARGV[4] unused).
--          ARGV[5] the definition to store ("": unchanged), ARGV[6] the member of the
--          tick to schedule ("": none, the schedule stays paused), ARGV[7] its payload
--          (sort key .. data), ARGV[8] its due time (epoch ms), ARGV[9] the ticks after it,
--          ARGV[10] the overlap policy and ARGV[11] the limit ("": none) stored with a
--          definition (unused without one), ARGV[12] "end": the schedule's window is over
--          (nothing is chained; else ""), ARGV[13] how many missed ticks were dropped (past
--          their start deadline: counted in "|d"), ARGV[14..] pairs of redis message id and
--          encoded message pushed to the ready queue now (missed ticks that run, by the
--          catch-up policy). With overlap "skip" only the first of them is pushed, and none
--          while the run last enqueued ("|u") is still scheduled, ready or in flight (the
--          others are counted in "|k"); with a limit, no more than the runs left, and the
--          schedule ends ("|e" = "limit", nothing chained) when none is left.
--          Clears "|s" and, unless ARGV[6] is "", "|p" and "|e"; ticks run now update "|r"
--          and "|l" (the latest of them) and "|n". Returns 1, 2 when the schedule ended in
--          this call ("|e" set), or 0 when the guard failed (nothing written: another
--          worker changed it first).
-- "extend": append the ticks ARGV[4] (comma-separated) to "|t" if its last tick is ARGV[3]
--          ("": the list is empty) and the chain is scheduled. Returns 1, or 0.
-- "pause": unschedule the chain's tick, mark paused. Returns 1, or 0 if it was paused.
-- "remove": unschedule the chain's tick and forget the schedule. Returns 1, or 0 if unknown.
-- "sweep": every schedule at once (ARGV[2] unused; see the code).
-- "check": read the schedule; a chain whose tick is no longer scheduled (cancelled or
--          cleared by an operator) while neither paused, waiting nor ended is marked
--          waiting from the tick after the last run (ARGV[3]: the server time in ms, used
--          when none ran). Returns {definition or false, "|s" or "", "|p" or "", "|t" or "",
--          chain member or "", "|e" or ""}.
-- "begin": a worker is about to start the schedule's tick ARGV[3] (epoch ms), which must
--          start by ARGV[4] (its due time plus the start deadline, epoch ms, server clock).
--          Returns 1 (start it: "|g" records the tick) when the server time is not past
--          ARGV[4] or the tick started before ("|g" >= ARGV[3]: a redelivery), else 0 (drop
--          it: counted in "|d"). Nothing is written for a schedule no longer stored.
--
-- Reads and checks come before the first write: a key of the wrong type, a due time that
-- is not a number or an unknown operation fails the call with nothing written.

-- include: message_id_of.lua
-- include: wake.lua

local schedules, chains, state, zset, backup, payloads = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local channel, ready, ready_msgs, idle = KEYS[7], KEYS[8], KEYS[9], KEYS[10]
local op, name = ARGV[1], ARGV[2]

-- A chain whose tick is no longer scheduled (cancelled or cleared by an operator) while
-- neither paused, waiting nor ended is marked waiting from the tick after its last run
-- (now_ms when none ran). Returns the tick it now waits at, or nil ("check" and "sweep").
local function mark_broken(each, member, waiting, paused, ended, last_run, now_ms)
    if paused or waiting or ended or (member and redis.call("ZSCORE", zset, member)) then
        return nil
    end
    local from = last_run and string.format("%d", tonumber(last_run) + 1) or now_ms
    redis.call("HDEL", chains, each)
    redis.call("HSET", state, each .. "|s", from)
    return from
end

if op == "sweep" then
    -- Every schedule of the queue in one call (a consumer's maintenance): those whose
    -- chain waits to be resumed, whose tick is no longer scheduled (then marked waiting, as
    -- "check" does; ARGV[3] the server time in ms) or that have fewer than ARGV[4]
    -- upcoming times. Returns their names.
    local found = {}
    local all = redis.call("HGETALL", schedules)
    for i = 1, #all, 2 do
        local each = all[i]
        local got = redis.call("HMGET", state, each .. "|s", each .. "|p", each .. "|t", each .. "|r", each .. "|e")
        if not got[2] and not got[5] then
            local member = redis.call("HGET", chains, each)
            local times = 0
            for _ in string.gmatch(got[3] or "", "[^,]+") do
                times = times + 1
            end
            local from = mark_broken(each, member, got[1], got[2], got[5], got[4], ARGV[3])
            if from or got[1] or times < tonumber(ARGV[4]) then
                found[#found + 1] = each
            end
        end
    end
    return found
end

local definition = redis.call("HGET", schedules, name)
local chained = redis.call("HGET", chains, name)
local flags = redis.call("HMGET", state, name .. "|s", name .. "|p", name .. "|t", name .. "|r", name .. "|e")
local stalled, paused, upcoming, last_run, ended = flags[1], flags[2], flags[3], flags[4], flags[5]

-- The scheduled tick leaves the ZSET and the payload hash (its backup-list entry is
-- trimmed by transfer.lua's upkeep like any cancelled member's).
local function unchain()
    if chained then
        redis.call("ZREM", zset, chained)
        redis.call("HDEL", payloads, message_id_of(chained))
        redis.call("HDEL", chains, name)
    end
end

if op == "check" then
    local from = definition and mark_broken(name, chained, stalled, paused, ended, last_run, ARGV[3])
    if from then
        stalled, chained = from, false
    end
    return {definition or false, stalled or "", paused or "", upcoming or "", chained or "", ended or ""}
end

if op == "begin" then
    local tick, latest = tonumber(ARGV[3]), tonumber(ARGV[4])
    if not tick or not latest then
        return redis.error_reply("ERR schedule: begin takes a tick and a time in ms")
    end
    local t = redis.call("TIME")
    local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    if tick <= (tonumber(redis.call("HGET", state, name .. "|g")) or -1) then
        return 1
    end
    if now_ms > latest then
        if definition then
            redis.call("HINCRBY", state, name .. "|d", 1)
        end
        return 0
    end
    if definition then
        redis.call("HSET", state, name .. "|g", ARGV[3])
    end
    return 1
end

-- Whether a redis message id is a run still to finish: scheduled (a retry: its message id
-- has a payload), ready, or in flight until acked.
local function outstanding(redis_id)
    return redis_id and (redis.call("HEXISTS", ready_msgs, redis_id) == 1
        or redis.call("HEXISTS", payloads, message_id_of(redis_id)) == 1)
end

if op == "start" then
    local kind, expected = ARGV[3], ARGV[4]
    local holds
    if kind == "def" then
        holds = (definition or "") == expected
    elseif kind == "stall" then
        holds = stalled == expected
    else
        holds = paused == "1"
    end
    if not holds then
        return 0
    end
    local member, payload, due = ARGV[6], ARGV[7], ARGV[8]
    if member ~= "" and not tonumber(due) then
        return redis.error_reply("ERR schedule: the due time must be a number of ms, not " .. tostring(due))
    end
    local head = redis.call("ZRANGE", zset, 0, 0, "WITHSCORES")
    redis.call("LLEN", backup) -- type checks: the writes below must not fail halfway
    redis.call("HLEN", payloads)
    redis.call("LLEN", ready)
    redis.call("HLEN", ready_msgs)
    redis.call("ZCARD", idle)
    unchain()
    if ARGV[5] ~= "" then
        redis.call("HSET", schedules, name, ARGV[5])
        if ARGV[10] == "skip" then
            redis.call("HSET", state, name .. "|o", "skip")
        else
            redis.call("HDEL", state, name .. "|o", name .. "|u")
        end
        if ARGV[11] ~= "" then
            redis.call("HSET", state, name .. "|m", ARGV[11])
        else
            redis.call("HDEL", state, name .. "|m")
        end
    end
    redis.call("HDEL", state, name .. "|s")
    if (tonumber(ARGV[13]) or 0) > 0 then
        redis.call("HINCRBY", state, name .. "|d", ARGV[13])
    end
    -- The missed ticks that run now: by the overlap policy and the runs left.
    local policy = redis.call("HMGET", state, name .. "|o", name .. "|u", name .. "|m", name .. "|n")
    local given = math.floor(math.max(#ARGV - 13, 0) / 2)
    local keep = given
    if given > 0 and policy[1] == "skip" then
        keep = outstanding(policy[2]) and 0 or 1
        if given > keep then
            redis.call("HINCRBY", state, name .. "|k", given - keep)
        end
    end
    local runs, limit = tonumber(policy[4]) or 0, tonumber(policy[3])
    if limit then
        keep = math.max(math.min(keep, limit - runs), 0)
    end
    local finish = ARGV[12]
    if limit and runs + keep >= limit then
        finish = "limit"
    end
    if finish ~= "" then
        redis.call("HSET", state, name .. "|e", finish)
        member = ""
    elseif ARGV[6] ~= "" then
        redis.call("HDEL", state, name .. "|e")
    end
    if member ~= "" then
        redis.call("HDEL", state, name .. "|p")
        redis.call("ZADD", zset, due, member)
        redis.call("RPUSH", backup, member)
        redis.call("HSET", payloads, message_id_of(member), payload)
        redis.call("HSET", chains, name, member)
        redis.call("HSET", state, name .. "|t", ARGV[9])
        if not head[2] or tonumber(due) < tonumber(head[2]) then
            redis.call("PUBLISH", channel, due)
        end
    end
    if keep > 0 then
        local ids, pairs_ = {}, {}
        for i = 14, 12 + 2 * keep, 2 do
            ids[#ids + 1] = ARGV[i]
            pairs_[#pairs_ + 1] = ARGV[i]
            pairs_[#pairs_ + 1] = ARGV[i + 1]
        end
        redis.call("RPUSH", ready, unpack(ids)) -- the plain lane (a fetch through lanes takes it in turn)
        redis.call("HSET", ready_msgs, unpack(pairs_))
        wake(idle, channel .. ":wake:{", #ids)
        -- The latest of them is the schedule's last run, as transfer.lua records a tick's.
        local last = tonumber(string.match(ids[#ids], ":(%d+)$"))
        if last then
            local t = redis.call("TIME")
            local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
            redis.call("HSET", state, name .. "|r", string.format("%d", last), name .. "|l", now_ms - last)
        end
        redis.call("HINCRBY", state, name .. "|n", keep)
        if policy[1] == "skip" then
            redis.call("HSET", state, name .. "|u", ids[#ids])
        end
    end
    return finish ~= "" and 2 or 1
end

if op == "extend" then
    local last = string.match(upcoming or "", "([%d+]+)$") or ""
    if not chained or last ~= ARGV[3] then
        return 0
    end
    local joined = ARGV[4]
    if upcoming and upcoming ~= "" then
        joined = upcoming .. "," .. ARGV[4]
    end
    redis.call("HSET", state, name .. "|t", joined)
    return 1
end

if op == "pause" then
    if paused or not definition then
        return 0
    end
    redis.call("ZCARD", zset) -- type checks before the first write
    redis.call("HLEN", payloads)
    unchain()
    redis.call("HDEL", state, name .. "|s")
    redis.call("HSET", state, name .. "|p", "1")
    return 1
end

if op == "remove" then
    if not definition then
        return 0
    end
    redis.call("ZCARD", zset)
    redis.call("HLEN", payloads)
    unchain()
    redis.call("HDEL", schedules, name)
    redis.call("HDEL", state, name .. "|t", name .. "|r", name .. "|l", name .. "|s", name .. "|p", name .. "|o",
        name .. "|u", name .. "|m", name .. "|n", name .. "|k", name .. "|d", name .. "|e", name .. "|g")
    return 1
end

return redis.error_reply("ERR schedule: unknown operation " .. tostring(op))
