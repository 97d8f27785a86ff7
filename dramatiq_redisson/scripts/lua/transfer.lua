-- transfer: move due entries from a queue's ZSET into its ready queue, atomically,
-- and keep the backup list free of entries that are no longer scheduled.
--
-- KEYS[1]  timeout_zset    ZSET  redisson_delay_queue_timeout:{N}   member -> due time (epoch ms)
-- KEYS[2]  backup_list     LIST  redisson_delay_queue:{N}           backup list, offer order
-- KEYS[3]  payloads        HASH  redisson_delay_queue_msgs:{N}      message id -> sort key .. payload (compact
--                                                    or encoded message: see ready_body.lua)
-- KEYS[4]  compact_list    LIST  redisson_delay_queue_compact:{N}   backup list being rebuilt by a compaction pass
-- KEYS[5]  compact_cursor  STRING redisson_delay_queue_cursor:{N}   read position of the compaction pass,
--                                                    or "-" (PX) until the next upkeep tick
-- KEYS[6]  ready           LIST  <ns>:<queue>           ready queue (redis message ids)
-- KEYS[7]  ready_msgs      HASH  <ns>:<queue>.msgs      redis message id -> encoded message
-- KEYS[8]  xq              ZSET  <ns>:<queue>.XQ        dead letters, scored by time of death (epoch ms)
-- KEYS[9]  xq_msgs         HASH  <ns>:<queue>.XQ.msgs   dead letter id -> data
-- KEYS[10] lease           STRING redisson_delay_queue_lease:{N}     "<token> <expiry ms>" (PX): who transfers
-- KEYS[11] consumers       ZSET  redisson_delay_queue_consumers:{N}  consumer token -> last seen (epoch ms)
-- KEYS[12] idle            ZSET  redisson_delay_queue_idle:{N}       consumer token -> messages it can start now
-- KEYS[13] channel         CHANNEL redisson_delay_queue_channel:{N}  wake channels are this .. ":wake:{token}"
-- KEYS[14] acks            SET   <ns>:__acks__.<worker id>.<queue>   the caller's ack set (hand-off, below)
-- KEYS[15] sent            ZSET  redisson_delay_queue_sent:{N}      member -> when it moved (epoch ms), kept
--                                                    for the dedupe window
-- KEYS[16] dedupe          HASH  redisson_delay_queue_dedupe:{N}    dedupe key -> scheduled message id
-- KEYS[17] keyed           HASH  redisson_delay_queue_keyed:{N}     message id -> "<ttl ms>:<dedupe key>"
-- KEYS[18] holds           ZSET  redisson_delay_queue_holds:{N}     dedupe key -> end of its throttle window
-- KEYS[19] throttle_copies HASH  redisson_delay_queue_held:{N}      throttle copies: dedupe key -> encoded message that moved
-- KEYS[20] chains          HASH  redisson_delay_queue_chains:{N}    schedule name -> member of its next tick
-- KEYS[21] schedule_state  HASH  redisson_delay_queue_schedule_state:{N}  "<name>|t" the ticks after it, ...
--                                                    (see schedule.lua)
-- KEYS[22] paused          STRING redisson_delay_queue_paused:{N}   set while the queue is paused: no hand-off
-- KEYS[23] fetched         HASH  redisson_delay_queue_fetched:{N}   fetch records of handed-off messages
-- KEYS[24] flow +lanes     HASH  redisson_delay_queue_flow:{N}     optional, the +lanes keys: the flow
--                                keys (see flow_context.lua), with ARGV[15] and ARGV[16] the
--                                lanes' and rings' key prefixes
-- KEYS[25] levels +lanes   ZSET  redisson_delay_queue_levels:{N}
-- KEYS[26] lane_of +lanes  HASH  redisson_delay_queue_lane_of:{N}
--
-- ARGV[1]  limit  most entries to move in this call
-- ARGV[2]  trim_budget  most dead entries to pop from the head of the backup list (per upkeep tick)
-- ARGV[3]  compact_step  backup-list entries a compaction pass examines in this call
-- ARGV[4]  compact_slack  slack: a pass starts when LLEN(backup) > 2 * ZCARD + slack
-- ARGV[5]  token  the calling consumer's token, or "": transfer without looking at or taking
--          the lease (an operator's one-off transfer)
-- ARGV[6]  lease_ms  lease time in ms
-- ARGV[7]  own_slots  how many moved messages the caller can start now: its idle worker threads,
--          within its free prefetch (see Placement)
-- ARGV[8]  listening  "1" if the caller listens on its wake channel (it may be registered as idle),
--          "2" if it does and it places by idle threads (see Placement), "3" the same, but
--          it takes the message on a tie
-- ARGV[9]  window_ms  dedupe window in ms (0 or absent: moved members are not remembered)
-- ARGV[10]  queue_json  the queue's name as a JSON string (written back into compact payloads: see
--          ready_body.lua)
-- ARGV[11]  upkeep_ms  upkeep interval in ms: the backup list's head trim, the compaction check and
--          the trim of the dedupe window's moved members run at most this often (a
--          tick; KEYS[5] holds "-" until the next one), not on every call; 0: every call.
--          While a compaction pass runs, every call steps it and trims those members.
-- ARGV[12]  periodic_grace_ms  a periodic tick that moves more than this many ms after its time counts as
--          missed (see Periodic ticks)
-- ARGV[13]  periodic_low_water  a schedule with fewer upcoming ticks than this after the one chained is
--          returned, so that the caller adds more
-- ARGV[14]  caller  "<worker id>|<consumer token>" of the caller, recorded with the time of each
--          message handed off (as fetch.lua records a fetch)
-- ARGV[15]  lane_prefix +lanes  the lanes' key prefix (with the +lanes keys)
-- ARGV[16]  ring_prefix +lanes  the rings' key prefix
--
-- Lanes: while the queue's flow is on (its flag, ARGV[15] .. "on}", exists: read in the
-- MGET below), moved messages go to the lanes that KEYS[26] recorded for them at the
-- offer (the ready queue when none) and nothing is
-- handed off: consumers fetch by priority and in turn (fetch.lua).
--
-- Moved members are remembered in KEYS[15] for the dedupe window, so that offering the
-- same prepared message again after it ran and was acked (a resend after a lost reply,
-- or after NotReplicated) does not schedule it a second time (see offer.lua).
--
-- Dedupe keys (see dedupe_split.lua): a moved (or dead-lettered) message that held a key
-- releases it; one with a ttl keeps it taken for ttl ms more (a throttle window, with a
-- copy of the moved message). This costs one EXISTS per call when the queue has no keyed
-- message, and O(keyed moved messages) otherwise: no JSON is decoded.
--
-- The lease: one consumer per queue runs the transfers (the timer); any consumer may
-- call, and a call while another consumer holds the lease only records the caller as
-- seen and returns when the lease ends, so a fleet of N processes runs one transfer per
-- due time instead of N. A call without a lease holder (or from the holder) transfers
-- and takes (or renews) the lease. Moving stays correct whoever calls: the script is
-- atomic, so two callers that both think they hold the lease cannot move an entry twice.
--
-- Hand-off: when the ready queue was empty, the first moved messages the caller places on
-- itself go straight into the caller's ack set and come back with the reply (a
-- fetch in the same call: one call per delayed message instead of two). When the ready
-- queue already had messages, everything moved queues behind them (FIFO) and the caller
-- fetches as usual. Nothing is handed off while the queue is paused (KEYS[22]): the
-- messages move to the ready queue and wait there. A caller that listens on its wake
-- channel is then listed in the idle registry with what it can start still (as fetch.lua
-- does; 0 when it took all it can start).
--
-- Placement (issue 46): a moved message goes where a worker thread is free now. The
-- caller takes one only while it can start more than the idle consumer that can start
-- the most (read only when ARGV[8] is "2" or "3": otherwise jobs are short, and the
-- caller takes what its idle threads can start: no read, and the hand-off saves a wake-up
-- and a fetch, which short jobs would feel), one message at a time; a tie goes to the other consumer
-- ("2") or to the caller ("3"): the caller picks either at random, for an even share
-- between consumers that are both idle at every due time. The
-- rest wait in the ready queue and wake as many idle consumers (wake.lua, the caller
-- excepted), the one that can start the most first.
--
-- Periodic ticks (schedule.lua): a due member that is its schedule's chained tick (its
-- message id "periodic:<name>:<tick ms>", and KEYS[20] names it) schedules the next tick of
-- the chain in the same step: the first time in "<name>|t" after it, with the same payload
-- but the new time as its timestamp. So a schedule has one tick scheduled at any time,
-- however many consumers transfer, and each tick moves once. A tick that moves late (more
-- than ARGV[12] ms, or after the next tick's time too: every worker was down) is not run
-- here: the chain stops, "|s" records the tick, and the caller resumes it by the
-- schedule's catch-up policy (periodic/_schedules.py); so does a chain that ran out of upcoming
-- times. Both, and a chain running low on times, are returned (the 10th value). Every
-- other message (a retry of a tick, a tick run now by hand) moves as usual. A schedule's
-- policies (issue 50: jitter in "|t", overlap "skip", a limit; see chain_step.lua) are read
-- only for a due member whose message id starts with "periodic:": the other messages'
-- path is unchanged.
--
-- Wake-ups: moved messages the caller does not take wake as many idle consumers (see
-- wake.lua).
--
-- The member of an entry is its sort key (key_len.lua) followed by the message id; the
-- member is also the redis message id the entry gets in the ready queue.
--
-- Every step is a handful of variadic commands per call, not commands per entry:
-- the cost is O(moved + examined + log n), never O(backlog).
--
-- Memory (see scripts/README.md): the first write is the ZREM of the due entries, so due
-- messages keep moving on a full server (they move from one hash to another).
-- A compaction step copies entries to a new list: when nothing else was written in
-- the call it tries that copy with pcall and, on a full server, leaves the pass
-- where it is until a later call.
--
-- The lease and registry writes come last (the first of them a ZREM), so they never
-- make the call's first write a growing one.
--
-- Returns: {moved, next due time in epoch ms or -1, server time in epoch µs,
--           entries sent to the dead letters, 0 if the caller holds the lease now or
--           else when the other holder's lease ends (epoch ms), handed-off messages as a
--           flat list id1, data1, ..., 1 if the caller is now registered as idle else 0,
--           for each moved message how late it moved: now minus its due time, in ms
--           (server clock), in due order, the other holder's token or "" if the caller
--           holds the lease, names of schedules to attend to (see Periodic ticks)}
-- returns: {moved, next_due_ms, server_now_us, dead, lease_until_ms, fetched, registered,
--           lateness_ms, holder, schedules}: the slots' names, read in this order by
--           TransferResult (scripts/_calls.py; tests/scripts/test_key_lists.py checks them)

-- Its duties, each in an include of its own: the lease (lease_renew.lua), periodic chaining
-- (chain_step.lua), the backup list's upkeep (backup_upkeep.lua), dedupe keys (dedupe_split.lua),
-- waking idle consumers (wake.lua); this file moves the due entries, hands them off,
-- and puts the duties in order.

-- include: key_len.lua
-- include: message_id_of.lua
-- include: ready_body.lua
-- include: variadic.lua
-- include: gather.lua
-- include: release_keys.lua
-- include: caller_share.lua
-- include: lease_end_of.lua
-- include: lease_other.lua
-- include: lease_seen.lua
-- include: lease_renew.lua
-- include: periodic_lib.lua
-- include: backup_upkeep.lua
-- include: wake.lua
-- include: flow_context.lua
-- include: flow_lib.lua

local zset, backup, payloads, compact, cursor_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local ready, ready_msgs, xq, xq_msgs = KEYS[6], KEYS[7], KEYS[8], KEYS[9]
local lease, consumers, idle, channel = KEYS[10], KEYS[11], KEYS[12], KEYS[13]
-- Only what every call needs is read here: the upkeep's arguments (ARGV[2..4], [11]) are
-- read on an upkeep tick, the dedupe window (ARGV[9]) when a message moves or on a tick,
-- the periodic ones (ARGV[12..13]) when a tick is due (tonumber costs a call ~1 µs).
local limit = tonumber(ARGV[1])
local token, own_slots = ARGV[5], tonumber(ARGV[7])
local lease_ms = token ~= "" and tonumber(ARGV[6]) or 0
local mode = ARGV[8]
local acks, listening = KEYS[14], mode == "1" or mode == "2" or mode == "3"
local compare, keep_ties = mode == "2" or mode == "3", mode == "3"
local sent = KEYS[15]
local queue_json = ARGV[10]
local dedupe, keyed, holds, throttle_copies = KEYS[16], KEYS[17], KEYS[18], KEYS[19]

local t = redis.call("TIME")
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local now_ms = math.floor(now_us / 1000)

-- The STRING keys of the queue's state in one read: the lease, the compaction cursor
-- (or upkeep marker), the pause and the flow's flag (an older ACL rule without MGET:
-- one GET each, see scripts/README.md).
local flow = KEYS[24] and flow_context(ready, KEYS[24], KEYS[25], KEYS[26], ARGV[15], ARGV[16])
local flag = flow and flow.flag or KEYS[22] -- (the pause again: MGET needs a key)
local state = redis.pcall("MGET", lease, cursor_key, KEYS[22], flag)
if state.err then
    state = {
        redis.call("GET", lease),
        redis.call("GET", cursor_key),
        redis.call("EXISTS", KEYS[22]) == 1,
        flow and redis.call("EXISTS", flag) == 1,
    }
end
local laned = flow and state[4] and true or false
local lease_end = nil
if token ~= "" then
    local other, other_end = lease_other(state[1], token)
    if other then
        lease_seen(consumers, token, now_ms)
        return { 0, -1, now_us, 0, other_end or now_ms + lease_ms, {}, 0, {}, other, {} }
    end
    lease_end = lease_end_of(state[1])
end

-- Periodic ticks (see the header and chain_step.lua): decided by reads only; the writes come
-- after the ZREM below, the call's first write. Their state is made when a tick is due.
local chain = nil

local moved, dead = 0, 0
local handed = {}
local handing, take = false, 0 -- the moved messages could be handed off; how many were
local wrote = false
local lateness = {}
-- The first two entries. When at most one of them is due (one message per due time, the
-- common case) they tell both what moves and the next due time, and the reply needs no
-- second read of the head at the end (unless a periodic tick adds an entry meanwhile).
local probe = redis.call("ZRANGE", zset, 0, 1, "WITHSCORES")
local due_flat, next_known = nil, nil
if probe[3] and limit > 1 and tonumber(probe[4]) <= now_ms then
    due_flat = redis.call("ZRANGEBYSCORE", zset, "-inf", now_ms, "WITHSCORES", "LIMIT", 0, limit)
elseif probe[1] and limit >= 1 and tonumber(probe[2]) <= now_ms then
    next_known = tonumber(probe[4] or "-1")
    -- The common call (issue 55): one entry due, an ordinary message with its payload, no
    -- lanes. It moves here, in straight-line code without the batch's tables (what a call
    -- costs the server is mostly its Lua, not its commands); anything else (a periodic
    -- tick, a member without its payload, lanes) takes the batch path below, which does
    -- the same for any number of entries. The HGET is a read: the first write is the ZREM.
    local member = probe[1]
    local n = key_len(member)
    local data = not laned and #member > n and string.sub(member, n + 1, n + 9) ~= "periodic:"
        and redis.call("HGET", payloads, string.sub(member, n + 1))
    if data and string.sub(data, 1, n) == string.sub(member, 1, n) then
        local message_id = string.sub(member, n + 1)
        local body = ready_body(member, string.sub(data, n + 1), queue_json)
        local pair = { member, body }
        redis.call("ZREM", zset, member)
        wrote = true
        redis.call("HDEL", payloads, message_id)
        redis.call("HSET", ready_msgs, member, body)
        moved = 1
        lateness[1] = now_ms - tonumber(probe[2])
        if own_slots > 0 and token ~= "" and not state[3] and redis.call("LLEN", ready) == 0 then
            handing = true
            take = compare and caller_share(idle, token, own_slots, 1, keep_ties) or 1
            if take > 0 then
                handed = pair
                redis.call("SADD", acks, member)
                redis.call("HSET", KEYS[23], member, now_ms .. "|" .. (ARGV[14] or ""))
            end
        end
        if take == 0 then
            redis.call("RPUSH", ready, member)
        end
        if sent and tonumber(ARGV[9] or "0") > 0 then
            redis.call("ZADD", sent, now_ms, member)
        end
        release_keys(keyed, dedupe, holds, throttle_copies, { message_id }, pair, now_ms)
    else
        due_flat = { probe[1], probe[2] }
    end
else
    next_known = tonumber(probe[2] or "-1")
end
if due_flat then
    local due, due_at = {}, {}
    for i = 1, #due_flat, 2 do
        due[#due + 1] = due_flat[i]
        due_at[#due_at + 1] = tonumber(due_flat[i + 1])
    end
    local message_ids = {}
    for i = 1, #due do
        message_ids[i] = message_id_of(due[i])
    end
    local stored = gather("HMGET", payloads, message_ids)
    local ready_pairs, members, delivered = {}, {}, {}
    local xq_pairs, xq_msg_pairs, buried, skipped = nil, nil, nil, nil -- made when needed
    for i = 1, #due do
        local member, data = due[i], stored[i]
        local n = key_len(member)
        local valid = #member > n and data and string.sub(data, 1, n) == string.sub(member, 1, n)
        local runs = valid
        if valid and string.sub(member, n + 1, n + 9) == "periodic:" then
            chain = chain or {
                chains = KEYS[20], state = KEYS[21], zset = zset, backup = backup, payloads = payloads,
                ready_msgs = ready_msgs, now_ms = now_ms, grace = tonumber(ARGV[12] or "1000"),
                low_water = tonumber(ARGV[13] or "0"), writes = {}, attend = {}
            }
            runs = periodic_lib().step(chain, member, string.sub(data, n + 1), due_at[i])
            if not runs then
                skipped = skipped or {}
                skipped[#skipped + 1] = message_ids[i] -- a missed tick: resumed by its catch-up policy
            end
        end
        if runs then
            local body = ready_body(member, string.sub(data, n + 1), queue_json)
            ready_pairs[#ready_pairs + 1] = member
            ready_pairs[#ready_pairs + 1] = body
            members[#members + 1] = member
            delivered[#delivered + 1] = message_ids[i]
            lateness[#lateness + 1] = now_ms - due_at[i]
            moved = moved + 1
        elseif not valid then
            -- A member without its payload cannot be delivered: keep what there
            -- is for inspection instead of dropping it silently.
            xq_pairs, xq_msg_pairs, buried = xq_pairs or {}, xq_msg_pairs or {}, buried or {}
            xq_pairs[#xq_pairs + 1] = now_ms
            xq_pairs[#xq_pairs + 1] = member
            xq_msg_pairs[#xq_msg_pairs + 1] = member
            xq_msg_pairs[#xq_msg_pairs + 1] = data or member
            buried[#buried + 1] = message_ids[i]
            dead = dead + 1
        end
    end
    variadic("ZREM", zset, due)
    wrote = true
    if skipped then
        variadic("HDEL", payloads, skipped)
    end
    if chain then
        for i = 1, #chain.writes do
            periodic_lib().write(chain, chain.writes[i])
        end
    end
    if moved > 0 then
        variadic("HDEL", payloads, delivered)
        variadic("HSET", ready_msgs, ready_pairs)
        if laned then
            local lanes, recorded = {}, {}
            for i = 1, #delivered, 1000 do
                local chunk = redis.call("HMGET", flow.lane_of, unpack(delivered, i, math.min(#delivered, i + 999)))
                for j = 1, #chunk do
                    lanes[#lanes + 1] = chunk[j]
                    if chunk[j] then
                        recorded[#recorded + 1] = delivered[i + j - 1]
                    end
                end
            end
            if #recorded > 0 then
                variadic("HDEL", flow.lane_of, recorded)
            end
            flow_lib().push(flow, members, lanes, false) -- no hand-off: consumers fetch through the lanes
        elseif own_slots > 0 and token ~= "" and not state[3] and redis.call("LLEN", ready) == 0 then
            handing = true
            if compare then
                take = caller_share(idle, token, own_slots, moved, keep_ties)
            else
                take = math.min(own_slots, moved)
            end
            if take > 0 then
                local record, records = now_ms .. "|" .. (ARGV[14] or ""), {}
                for i = 1, take do
                    handed[#handed + 1] = members[i]
                    handed[#handed + 1] = ready_pairs[2 * i]
                    records[2 * i - 1] = members[i]
                    records[2 * i] = record
                end
                redis.call("SADD", acks, unpack(members, 1, take))
                redis.call("HSET", KEYS[23], unpack(records))
            end
        end
        if not laned and take < moved then
            variadic("RPUSH", ready, { unpack(members, take + 1) })
        end
        if sent and tonumber(ARGV[9] or "0") > 0 then
            local stamped = {}
            for i = 1, #members do
                stamped[#stamped + 1] = now_ms
                stamped[#stamped + 1] = members[i]
            end
            variadic("ZADD", sent, stamped)
        end
    end
    if dead > 0 then
        variadic("ZADD", xq, xq_pairs)
        variadic("HSET", xq_msgs, xq_msg_pairs)
    end
    -- Dedupe keys of the messages that left the schedule: released, or held for their ttl.
    local leaving = delivered
    if buried then
        leaving = {}
        for i = 1, #delivered do
            leaving[i] = delivered[i]
        end
        for i = 1, #buried do
            leaving[#leaving + 1] = buried[i]
        end
    end
    release_keys(keyed, dedupe, holds, throttle_copies, leaving, ready_pairs, now_ms)
end

local cursor = state[2]
local tick = cursor ~= "-" -- "-": between upkeep ticks (a compaction pass steps on every call)
local window = tick and tonumber(ARGV[9] or "0")
local upkeep_ms = tick and tonumber(ARGV[11] or "0")
local refused = tick and backup_upkeep(zset, backup, compact, cursor_key, cursor, wrote, tonumber(ARGV[2]),
    tonumber(ARGV[3]), tonumber(ARGV[4]), upkeep_ms)
if refused then
    return refused
end
if tick and sent and window > 0 then
    -- Moved members older than the dedupe window leave; the key outlives the newest by
    -- the window (and a tick). After the compaction step: its copy stays the call's
    -- first write when nothing moved.
    redis.call("ZREMRANGEBYSCORE", sent, "-inf", string.format("(%d", now_ms - window))
    redis.call("PEXPIRE", sent, window + upkeep_ms)
end

-- The rest wake idle consumers (the caller excepted: it takes what is handed off, or
-- fetches up to what it can start when nothing could be handed off).
local placed = handing and take or own_slots
if moved > placed then
    wake(idle, channel .. ":wake:{", moved - placed, token)
end
local registered = 0
if moved > 0 and own_slots > 0 then
    if handing and listening then
        redis.call("ZADD", idle, own_slots - take, token) -- what it can start still
        registered = 1
    else
        redis.call("ZREM", idle, token) -- the caller fetches these: not idle
    end
end
if token ~= "" then
    lease_renew(lease, consumers, token, lease_end, lease_ms, now_ms)
end

local next_due = next_known
if not next_due or (chain and #chain.writes > 0) then
    local first = redis.call("ZRANGE", zset, 0, 0, "WITHSCORES")
    next_due = first[1] and tonumber(first[2]) or -1
end
return {moved, next_due, now_us, dead, 0, handed, registered, lateness, "", chain and chain.attend or {}}
