-- bulk: promote (make due now) or remove scheduled messages in one bounded step: the
-- earliest `batch` of them, or the given members.
--
-- KEYS[1]  timeout_zset  ZSET  redisson_delay_queue_timeout:{N}   member -> due time (epoch ms)
-- KEYS[2]  payloads      HASH  redisson_delay_queue_msgs:{N}      message id -> sort key .. encoded message
-- KEYS[3]  channel       CHANNEL redisson_delay_queue_channel:{N} due time of a new head
-- KEYS[4]  dedupe        HASH  redisson_delay_queue_dedupe:{N}    dedupe key -> scheduled message id
-- KEYS[5]  keyed         HASH  redisson_delay_queue_keyed:{N}     message id -> "<ttl ms>:<dedupe key>"
-- KEYS[6]  lane_of +lane HASH  redisson_delay_queue_lane_of:{N}   optional: a removed message's lane
--                                                   record goes with it
--
-- ARGV[1]  action  "promote" or "remove"
-- ARGV[2]  batch  with no members, act on up to this many of the earliest entries
--          (for "promote", of those not yet due: due ones already run now)
-- ARGV[3..] members  (sort key .. message id), as a scan returned them: act on those of
--          them still scheduled (a member that moved, was cancelled or rescheduled under
--          a new sort key is skipped)
--
-- A promoted message keeps its member: it gets the server's now as due time and the
-- queue's transfer lease holder moves it within ms (a new head is announced on the
-- channel). Entries removed leave their backup-list member to transfer's trimming and
-- compaction, as cancel.lua does; their dedupe keys are released. A promoted message
-- keeps its dedupe key until it moves.
--
-- Cost: O(batch * log n) per call, whatever the backlog.
--
-- Memory: the first write is a ZREM (never grows memory), so both run on a full server.
--
-- Returns: the number of messages promoted or removed.

-- include: message_id_of.lua
-- include: unkey.lua

local zset, payloads, channel = KEYS[1], KEYS[2], KEYS[3]
local dedupe, keyed = KEYS[4], KEYS[5]
local action, batch = ARGV[1], tonumber(ARGV[2])
if action ~= "promote" and action ~= "remove" then
    return redis.error_reply("bulk: unknown action " .. tostring(action))
end
local t = redis.call("TIME")
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local members = {}
if #ARGV > 2 then
    local given = {}
    for i = 3, #ARGV do
        given[#given + 1] = ARGV[i]
    end
    local scores = redis.call("ZMSCORE", zset, unpack(given))
    for i = 1, #given do
        if scores[i] and (action == "remove" or tonumber(scores[i]) > now_ms) then
            members[#members + 1] = given[i]
        end
    end
elseif action == "promote" then
    members = redis.call("ZRANGEBYSCORE", zset, "(" .. now_ms, "+inf", "LIMIT", 0, batch)
else
    members = redis.call("ZRANGE", zset, 0, batch - 1)
end
if #members == 0 then
    return 0
end

redis.call("ZREM", zset, unpack(members))
if action == "remove" then
    local message_ids = {}
    for i = 1, #members do
        message_ids[i] = message_id_of(members[i])
    end
    redis.call("HDEL", payloads, unpack(message_ids))
    unkey(keyed, dedupe, message_ids)
    if KEYS[6] then
        redis.call("HDEL", KEYS[6], unpack(message_ids))
    end
else
    local pairs_ = {}
    for i = 1, #members do
        pairs_[#pairs_ + 1] = now_ms
        pairs_[#pairs_ + 1] = members[i]
    end
    redis.call("ZADD", zset, unpack(pairs_))
    redis.call("PUBLISH", channel, now_ms)
end
return #members
