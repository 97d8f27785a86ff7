-- state: where one message is on one queue, found by its message id (broker.message_state).
--
-- KEYS[1]  payloads      HASH  redisson_delay_queue_msgs:{N}      message id -> sort key .. payload (scheduled)
-- KEYS[2]  timeout_zset  ZSET  redisson_delay_queue_timeout:{N}   member -> due time (epoch ms)
-- KEYS[3]  ready_msgs    HASH  <ns>:<queue>.msgs                  redis message id -> encoded message (ready
--                                                                 and in flight)
-- KEYS[4]  fetched       HASH  redisson_delay_queue_fetched:{N}   redis message id -> fetch record (in flight)
-- KEYS[5]  xq            ZSET  <ns>:<queue>.XQ                    dead letters, scored by time of death (epoch ms)
-- KEYS[6]  xq_msgs       HASH  <ns>:<queue>.XQ.msgs               dead letter id -> data
-- KEYS[7]  done          ZSET  redisson_delay_queue_done:{N}      message id -> when its ack finished it (epoch
--                                                                 ms), written while done_retention is on
-- KEYS[8]  ready         LIST  <ns>:<queue>                       the ready queue (the plain lane)
-- KEYS[9]  lane_of       HASH  redisson_delay_queue_lane_of:{N}   message id -> its lane, for a message in
--                                                                 another lane than the plain one
-- KEYS[10] progress      HASH  redisson_delay_queue_progress:{N}  message id -> its last progress report
--                                                                 (_progress.py), kept from run to run
--
-- ARGV[1]  message_id  the message id looked for
-- ARGV[2]  search  how many ids a search reads at each end of a list, and of the newest dead
--          letters (0: the direct lookups alone, below)
-- ARGV[3]  lane_prefix  the lanes' key prefix (a lane's list is ARGV[3] .. lane .. "}")
--
-- Where a message is, by its message id (see _keys.py):
--
-- * scheduled (a retry too): its payload is kept under its message id (KEYS[1]); its member
--   (its sort key, then the message id) gives its due time. One HGET and one ZSCORE.
-- * ready or in flight: its data is kept under its redis message id (KEYS[3]), and in flight
--   it has a fetch record (KEYS[4]). An immediate send's redis id is its message id: one HGET
--   each. A message moved from the delayed queue has its member as redis id, whose sort key
--   the message id does not give: it is searched for (with ARGV[2] > 0) among the fetch
--   records (all of them: O(messages in flight)) and in its lane (KEYS[9] names a laned
--   message's; else the ready list), the first and the last ARGV[2] ids. A lane longer
--   than twice ARGV[2] is read in part: a message with more than ARGV[2] ids both before
--   and after it is not found there (the reply's `complete` is then 0).
-- * dead: a dead letter is kept under its redis id: an immediate send's is found by one
--   ZSCORE, a moved message's among the newest ARGV[2] dead letters.
-- * done: a record in KEYS[7] (one ZSCORE), while the broker's done_retention keeps them.
-- * its last progress report, whatever its state (one HGET): kept by message id until it
--   succeeds or dies.
--
-- A retry sent without a delay gets a fresh random redis id that names nothing of its
-- message: it is not found while it is ready, in flight or dead (the dead letters' own
-- search reads their data: DeadLetters.find).
--
-- The live copies come first (a retry scheduled while its failed run is still in flight
-- is "scheduled"), then the latest of a dead letter and a done record.
--
-- Cost: the direct lookups are a handful of commands, O(1) each. A search adds an HKEYS
-- of the fetch records, an HGET, an LLEN, one or two LRANGEs of at most ARGV[2] ids, a
-- ZRANGE of at most ARGV[2] dead letters and a ZCARD: O(in flight + ARGV[2]), the ids
-- searched as one text. Measured on Valkey 9.1 (SLOWLOG): the direct lookups about 11 µs;
-- a search with ARGV[2] 2 000 over a lane of 100 000 ids, 10 000 dead letters and 1 000
-- messages in flight about 2.3 ms, with 10 000 about 12 ms (most of it the ids read into
-- Lua). Reads only.
--
-- Returns: {state, redis message id or "", data or "", server now (epoch ms), a time (epoch
--           ms) or -1, fetch record or "", progress report or "", complete}
-- returns: {state, redis_message_id, data, now_ms, at_ms, record, progress, complete}
--           state: "scheduled" (data: the stored payload, sort key first; at: its due time),
--           "running" (data: the encoded message; record: its fetch record), "ready" (data:
--           the encoded message), "dead" (data: the dead letter; at: its time of death),
--           "done" (at: when its ack finished it), "unknown"; complete: 0 if a search read
--           part of a lane or of the dead letters and found no live copy there, else 1.

-- include: key_len.lua

local message_id, search, lane_prefix = ARGV[1], tonumber(ARGV[2]), ARGV[3]
local t = redis.call("TIME")
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local complete = 1
local progress = redis.call("HGET", KEYS[10], message_id) or ""

local stored = redis.call("HGET", KEYS[1], message_id)
if stored then
    local member = string.sub(stored, 1, key_len(stored)) .. message_id
    local due = redis.call("ZSCORE", KEYS[2], member)
    return { "scheduled", member, stored, now_ms, due and tonumber(due) or -1, "", progress, complete }
end

-- The members of this message id (its sort key, then the message id) among `ids`: the
-- first (or with `last`, the last) of them, or nil. One plain search of their text joined by
-- NUL bytes, not a Lua step per id: a candidate is checked only where the message id is.
local length = #message_id
local NUL = "\0"
local function member_in(ids, last)
    local text = NUL .. table.concat(ids, NUL) .. NUL
    local needle, at, found = message_id .. NUL, 1, nil
    while true do
        local p = string.find(text, needle, at, true)
        if not p then
            return found
        end
        for _, n in ipairs({ 14, 16 }) do -- (a sort key of this release, or an earlier one's)
            if p - n > 1 and string.byte(text, p - n - 1) == 0 then
                local id = string.sub(text, p - n, p + length - 1)
                if key_len(id) == n and not string.find(id, NUL, 1, true) then
                    if not last then
                        return id
                    end
                    found = id
                end
            end
        end
        at = p + 1
    end
end

-- The message under redis id `id` if its data is there: running (a fetch record) or ready.
local function live(id)
    local data = redis.call("HGET", KEYS[3], id)
    if not data then
        return nil
    end
    local record = redis.call("HGET", KEYS[4], id)
    if record then
        return { "running", id, data, now_ms, -1, record, progress, complete }
    end
    return { "ready", id, data, now_ms, -1, "", progress, complete }
end

local found = live(message_id)
if found then
    return found
end
local dead_id, died = nil, nil
local death = redis.call("ZSCORE", KEYS[5], message_id)
if death then
    dead_id, died = message_id, tonumber(death)
end

if search > 0 then
    local id = member_in(redis.call("HKEYS", KEYS[4]))
    found = id and live(id)
    if found then
        return found
    end
    local lane = redis.call("HGET", KEYS[9], message_id)
    local list = (lane and lane ~= "0:") and (lane_prefix .. lane .. "}") or KEYS[8]
    local ids = redis.call("LLEN", list)
    local ranges = { { 0, search - 1 } }
    if ids > search then
        ranges[2] = { math.max(search, ids - search), -1 }
    end
    for _, range in ipairs(ranges) do
        id = member_in(redis.call("LRANGE", list, range[1], range[2]))
        found = id and live(id)
        if found then
            return found
        end
    end
    if ids > 2 * search then
        complete = 0 -- (the middle of its lane was not read)
    end
    if not dead_id then
        local newest = redis.call("ZRANGE", KEYS[5], -search, -1)
        dead_id = member_in(newest, true)
        if dead_id then
            died = tonumber(redis.call("ZSCORE", KEYS[5], dead_id))
        elseif #newest >= search and redis.call("ZCARD", KEYS[5]) > search then
            complete = 0
        end
    end
end

local finished = redis.call("ZSCORE", KEYS[7], message_id)
finished = finished and tonumber(finished)
if dead_id and not (finished and finished > died) then
    return { "dead", dead_id, redis.call("HGET", KEYS[6], dead_id) or "", now_ms, died, "", progress, complete }
end
if finished then
    return { "done", "", "", now_ms, finished, "", progress, complete }
end
return { "unknown", "", "", now_ms, -1, "", progress, complete }
