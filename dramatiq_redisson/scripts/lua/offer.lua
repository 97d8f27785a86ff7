-- offer: schedule messages on a queue's delayed-queue structures, atomically.
--
-- KEYS[1]  timeout_zset    ZSET    redisson_delay_queue_timeout:{N}  member -> due time (epoch ms, server clock)
-- KEYS[2]  backup_list     LIST    redisson_delay_queue:{N}  members in offer order (backup list)
-- KEYS[3]  payloads        HASH    redisson_delay_queue_msgs:{N}  message id -> sort key .. encoded message
-- KEYS[4]  channel         CHANNEL redisson_delay_queue_channel:{N}  receives the due time of a new earliest entry
-- KEYS[5]  legacy_dq       LIST    <ns>:<queue>.DQ  legacy delay queue (only read when a claim id is given)
-- KEYS[6]  legacy_dq_msgs  HASH    <ns>:<queue>.DQ.msgs  legacy delay queue payloads
-- KEYS[7]  ready_msgs      HASH    <ns>:<queue>.msgs  ready messages (rel/abs: a member already
--                                  moved there is not offered again)
-- KEYS[8]  sent            ZSET    redisson_delay_queue_sent:{N}  members moved within the dedupe
--                                  window (rel/abs: not offered again either)
-- KEYS[9]  dedupe          HASH    redisson_delay_queue_dedupe:{N}  dedupe key -> scheduled message id
-- KEYS[10] keyed           HASH    redisson_delay_queue_keyed:{N}  message id -> "<ttl ms>:<dedupe key>"
-- KEYS[11] holds           ZSET    redisson_delay_queue_holds:{N}  dedupe key -> end of its throttle window
-- KEYS[12] throttle_copies HASH    redisson_delay_queue_held:{N}  throttle copies: dedupe key ->
--                                  encoded message that moved (KEYS[9..12]: see dedupe_split.lua)
-- KEYS[13] lane_of +lanes  HASH    redisson_delay_queue_lane_of:{N}  optional, with the other +lanes
--                                  keys: message id -> lane, for a scheduled message not in the
--                                  plain lane
-- KEYS[14] flow_flag +lanes STRING redisson_delay_queue_lane:{N}:{on}  the flow's flag (see flow_enable.lua)
--
-- ARGV[1]  mode  "rel": each time is a delay in ms added to the server clock;
--          "move:<redis message id>": as "rel", for the retry of a message in flight whose
--          copy is that id: on a full server (see Memory) that copy's payload is
--          dropped from KEYS[7] first, so the retry takes its place;
--          "abs": each time is an absolute due time in epoch ms (legacy migration);
--          "bulk": one delay in ms for every entry (enqueue_many)
-- ARGV[2..] entries  by mode:
-- rel/abs: ARGV[2..] repeated groups of 8:
--          time_ms, sort_key (see key_len.lua), message_id, payload (see ready_body.lua),
--          claim id ("" for a fresh offer; else a legacy .DQ id that must still be listed),
--          dedupe key ("": none), dedupe mode ("keep", "replace" or "retry"), ttl in ms;
--          with KEYS[13], groups of 9: the 9th the message's lane ("" or "0:": plain)
-- bulk:    ARGV[2] delay in ms; ARGV[3..] repeated pairs:
--          message_id, sort_key .. payload (with KEYS[13], triples: the lane third)
--
-- Lanes: a scheduled message with a lane other than "0:" is recorded in KEYS[13] (its
-- transfer moves it to that lane) and turns the queue's flow on (flow_context.lua); one
-- rescheduled without a lane loses its record.
--
-- A member is sort_key .. message_id: equal due times order by sort key (offer order).
-- Offering a message id that is already scheduled on this queue reschedules it (within
-- one call too: the last offer of an id wins). Offering the same member again (the same
-- prepared message, e.g. a retry of a call whose reply was lost) moves its due time
-- and leaves it scheduled once.
--
-- Memory (see scripts/README.md): a fresh offer reads (type-checks) every key it writes,
-- then writes the ZADD of the new members first: on a full server the whole call is
-- refused with OOM and writes nothing (a ZREM of the previous member first would let
-- every later write through). A legacy claim
-- (KEYS[5]) writes its LREM first: a migration moves data and runs on a full server.
-- "move:" (sent only after a refusal) writes the HDEL of the in-flight copy first, when
-- that copy is still there: the retry replaces it, and runs on a full server (the
-- worker's ack that follows finds nothing more to delete; a requeue of the id after
-- a crash finds no payload and drops it, so the retry stays the only copy).
--
-- rel/abs: an entry whose member is no longer scheduled but is on the ready queue or in
-- flight (KEYS[7]), or moved there within the dedupe window (KEYS[8], written by
-- transfer.lua: it may have run and been acked), is the same prepared message offered
-- again after it came due (a client's retry of a call whose reply was lost, a resend
-- after NotReplicated): it is not scheduled a second time.
--
-- Dedupe keys (rel/abs): an entry with a dedupe key k, while k is held by another
-- scheduled message A (KEYS[9]):
--   "keep": writes nothing; the entry's result is A (see Returns);
--   "replace": the entry is scheduled and A is cancelled (debounce: the last send wins);
--   "retry": the re-offer of a message whose copy ran and failed (Retries): as "keep".
-- While k is in a throttle window (KEYS[11], its message moved less than its ttl ago),
-- "keep" and "replace" write nothing (the result is the message that moved); "retry"
-- is scheduled (a retry is no new send) and ends the window. Otherwise the entry is
-- scheduled and holds k, with its ttl: when it moves (transfer.lua) k is released, or
-- held for ttl ms. An entry whose message id already holds k: "keep" writes nothing
-- (it is returned), "replace" and "retry" reschedule it. Offering a scheduled message id
-- without its key (or with another) releases the key it held (bulk mode too), so the
-- index never names a message that is not scheduled under that key. Ended windows are
-- trimmed by transfer.lua (and expire with the latest one), not here.
--
-- Returns: rel/abs: a list with, per entry, the due time in epoch ms, -1 when its
--          claim id no longer existed (another process migrated it first), -2
--          when its member had already moved to the ready queue, or for an entry that
--          was not written because of its dedupe key: {due time of the message holding
--          the key in epoch ms, its member, its stored payload (sort key .. encoded
--          message)}, or {-3, "", encoded message} when a throttle window holds the key;
--          bulk: {entries, their due time in epoch ms}.

-- include: stored_key.lua
-- include: variadic.lua
-- include: dedupe_split.lua
-- include: unkey.lua
-- include: record_lane.lua
-- include: flow_lib.lua

local zset, backup, payloads, channel = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local legacy_list, legacy_msgs, ready_msgs, sent = KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local dedupe, keyed, holds, throttle_copies = KEYS[9], KEYS[10], KEYS[11], KEYS[12]
local lane_of = KEYS[13]
local step = lane_of and 9 or 8 -- ARGV per rel/abs entry
local laned = false -- a message with a lane was scheduled: the queue's flow goes on

local function lane_given(lane)
    return lane and lane ~= "" and lane ~= PLAIN_LANE
end

-- Reads first: a key of the wrong type fails the call before anything is written.
-- KEYS[3] is read (HGET/HMGET) before the first write of a plain offer, and KEYS[11] and
-- KEYS[12] before an entry's first write on every path that writes them. The dedupe
-- indexes (KEYS[9], KEYS[10]) are checked here when the entry has a dedupe key or the
-- call has several entries (and KEYS[3] too for a "move:" or a legacy claim, which
-- write before reading it); a single entry without a key writes them only when it
-- reschedules its message id, and that path checks them before its first write (see
-- check_indexes). Plain sends, the common case, skip three reads.
redis.call("LLEN", backup)
local indexes_checked = false
local function check_indexes()
    if not indexes_checked then
        redis.call("HLEN", dedupe)
        redis.call("HLEN", keyed)
        indexes_checked = true
    end
end
if ARGV[1] == "bulk" or #ARGV > 1 + step then
    check_indexes()
elseif string.sub(ARGV[1], 1, 5) == "move:" or (ARGV[6] and ARGV[6] ~= "") then
    -- A retry's "move:" and a legacy claim write before the entry's HGET: check it all.
    redis.call("HLEN", payloads)
    check_indexes()
elseif ARGV[7] and ARGV[7] ~= "" then
    check_indexes()
end

local t = redis.call("TIME")
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local mode = ARGV[1]
if string.sub(mode, 1, 5) == "move:" then
    local in_flight = string.sub(mode, 6)
    if redis.call("HEXISTS", ready_msgs, in_flight) == 1 then
        redis.call("ZCARD", zset) -- type check: the HDEL below becomes the first write
        redis.call("HDEL", ready_msgs, in_flight)
    end
    mode = "rel"
end

local added = {}
local any_added = false
local result = {}

if mode == "bulk" then
    -- Many entries, one due time: a handful of variadic commands per call.
    local due_ms = now_ms + tonumber(ARGV[2])
    local ids, last = {}, {}
    local repeated = false
    local width = lane_of and 3 or 2 -- ARGV per bulk entry
    for i = 3, #ARGV, width do
        ids[#ids + 1] = ARGV[i]
        repeated = repeated or last[ARGV[i]] ~= nil
        last[ARGV[i]] = i
    end
    local previous = {}
    for i = 1, #ids, CHUNK do
        local part = redis.call("HMGET", payloads, unpack(ids, i, math.min(#ids, i + CHUNK - 1)))
        for j = 1, #part do
            previous[i + j - 1] = part[j]
        end
    end
    local due_text = string.format("%d", due_ms)
    local stale, scored, pushed, stored, rescheduled = {}, {}, {}, {}, {}
    local lanes, unlaned = {}, {}
    for n = 1, #ids do
        local i = width * (n - 1) + 3
        local message_id, value = ARGV[i], ARGV[i + 1]
        -- The last offer of a message id wins; an earlier schedule of it leaves the ZSET
        -- (unless it is the same member: the ZADD below then only moves its due time).
        if last[message_id] == i then
            local member = stored_key(value) .. message_id
            local same = false
            if previous[n] then
                rescheduled[#rescheduled + 1] = message_id
                local old = stored_key(previous[n]) .. message_id
                same = old == member
                if not same then
                    stale[#stale + 1] = old
                end
            end
            scored[#scored + 1] = due_text
            scored[#scored + 1] = member
            if not same then
                pushed[#pushed + 1] = member
            end
            if repeated or lane_of then
                stored[#stored + 1] = message_id
                stored[#stored + 1] = value
            end
            if lane_of then
                if lane_given(ARGV[i + 2]) then
                    lanes[#lanes + 1] = message_id
                    lanes[#lanes + 1] = ARGV[i + 2]
                elseif previous[n] then
                    unlaned[#unlaned + 1] = message_id
                end
            end
            added[member] = true
            any_added = true
        end
    end
    if any_added then
        -- The first write grows memory (see the header), then the stale members go.
        variadic("ZADD", zset, scored)
        if #stale > 0 then
            variadic("ZREM", zset, stale)
        end
        if #pushed > 0 then
            variadic("RPUSH", backup, pushed)
        end
        -- Offered again without a dedupe key: a key it held is released.
        unkey(keyed, dedupe, rescheduled)
        if #lanes > 0 then
            variadic("HSET", lane_of, lanes)
            laned = true
        end
        if #unlaned > 0 then
            variadic("HDEL", lane_of, unlaned)
        end
        if repeated or lane_of then
            variadic("HSET", payloads, stored)
        else
            -- Every entry is kept: its (message id, value) pairs are ARGV[3..] as they are.
            for i = 3, #ARGV, 2 * CHUNK do
                redis.call("HSET", payloads, unpack(ARGV, i, math.min(#ARGV, i + 2 * CHUNK - 1)))
            end
        end
    end
    result = {#ids, due_ms}
else
    local relative = mode == "rel"
    for i = 2, #ARGV, step do
        local time_ms = tonumber(ARGV[i])
        local sort_key, message_id, data, claim = ARGV[i + 1], ARGV[i + 2], ARGV[i + 3], ARGV[i + 4]
        local key, key_mode, ttl = ARGV[i + 5], ARGV[i + 6], ARGV[i + 7]
        local claimed = true
        if claim ~= "" then
            -- Claim the id only while it is still listed: a built-in worker that
            -- fetched it meanwhile owns it. The ids were read from the head of the
            -- list, so this scan normally stops within the first few entries.
            claimed = redis.call("LREM", legacy_list, 1, claim) == 1
            if claimed then
                redis.call("HDEL", legacy_msgs, claim)
            end
        end
        -- The dedupe key's state (reads only): the scheduled message that holds it
        -- (holder, holder_stored), or a throttle window (window_body; window_seen also
        -- when the window has ended but is still recorded).
        local holder, holder_stored, window_seen, window_body = nil, nil, false, nil
        if claimed and key ~= "" then
            holder = redis.call("HGET", dedupe, key)
            if holder then
                holder_stored = redis.call("HGET", payloads, holder)
                if not holder_stored then
                    holder = nil -- never left stale (see dedupe_split.lua); if it were, it is free
                end
            else
                local window_end = redis.call("ZSCORE", holds, key)
                if window_end then
                    window_seen = true
                    local body = redis.call("HGET", throttle_copies, key) or ""
                    if tonumber(window_end) > now_ms then
                        window_body = body
                    end
                end
            end
        end
        if not claimed then
            result[#result + 1] = -1
        elseif window_body and key_mode ~= "retry" then
            result[#result + 1] = { -3, "", window_body }
        elseif holder and (key_mode == "keep" or (key_mode == "retry" and holder ~= message_id)) then
            local holder_member = stored_key(holder_stored) .. holder
            local holder_due = redis.call("ZSCORE", zset, holder_member)
            result[#result + 1] = { tonumber(holder_due or "-1"), holder_member, holder_stored }
        else
            local due_ms = time_ms
            if relative then
                due_ms = now_ms + time_ms
            end
            local previous = redis.call("HGET", payloads, message_id)
            if previous then
                check_indexes() -- a reschedule may release a key this id held
            end
            local member = sort_key .. message_id
            if
                not previous
                and claim == ""
                and (redis.call("HEXISTS", ready_msgs, member) == 1 or redis.call("ZSCORE", sent, member))
            then
                result[#result + 1] = -2
            else
                -- ZADD first: on a fresh offer it is the call's first write (see the header).
                local new = redis.call("ZADD", zset, string.format("%d", due_ms), member)
                if previous then
                    local old = stored_key(previous) .. message_id
                    if old ~= member then
                        redis.call("ZREM", zset, old)
                    end
                end
                if new == 1 then
                    redis.call("RPUSH", backup, member)
                end
                redis.call("HSET", payloads, message_id, sort_key .. data)
                if lane_of then
                    if lane_given(ARGV[i + 8]) then
                        redis.call("HSET", lane_of, message_id, ARGV[i + 8])
                        laned = true
                    elseif previous then
                        redis.call("HDEL", lane_of, message_id)
                    end
                end
                if previous then
                    -- A key this id held under another name (or none now) is released.
                    local had = redis.call("HGET", keyed, message_id)
                    if had then
                        local _, old_key = dedupe_split(had)
                        if old_key ~= key then
                            unkey(keyed, dedupe, { message_id })
                        end
                    end
                end
                if key ~= "" then
                    if holder and holder ~= message_id then
                        -- "replace": the new message takes the place of the holder.
                        redis.call("ZREM", zset, stored_key(holder_stored) .. holder)
                        redis.call("HDEL", payloads, holder)
                        redis.call("HDEL", keyed, holder)
                        if lane_of then
                            redis.call("HDEL", lane_of, holder)
                        end
                    end
                    if window_seen then
                        redis.call("ZREM", holds, key)
                        redis.call("HDEL", throttle_copies, key)
                    end
                    redis.call("HSET", dedupe, key, message_id)
                    redis.call("HSET", keyed, message_id, ttl .. ":" .. key)
                end
                added[member] = true
                any_added = true
                result[#result + 1] = due_ms
            end
        end
    end
end

if laned then
    flow_lib().enable(KEYS[14])
end
if any_added then
    local head = redis.call("ZRANGE", zset, 0, 0, "WITHSCORES")
    if head[1] and added[head[1]] then
        redis.call("PUBLISH", channel, head[2])
    end
end
return result
