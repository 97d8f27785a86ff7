-- offer_one: schedule one fresh message, the common send (offer.lua's "rel" mode for one
-- entry without a dedupe key, a claim or a retry's "move:"), with 6 keys and 5 arguments
-- instead of 12 and 9, and 6 commands instead of 9 (5 since HSETNX).
--
-- KEYS[1]  timeout_zset  ZSET    redisson_delay_queue_timeout:{N}  member -> due time (epoch ms, server clock)
-- KEYS[2]  backup_list   LIST    redisson_delay_queue:{N}  members in offer order (backup list)
-- KEYS[3]  payloads      HASH    redisson_delay_queue_msgs:{N}  message id -> sort key .. encoded message
-- KEYS[4]  channel       CHANNEL redisson_delay_queue_channel:{N}  receives the due time of a new earliest entry
-- KEYS[5]  sent          ZSET    redisson_delay_queue_sent:{N}  members moved within the dedupe window
-- KEYS[6]  ready_msgs    HASH    <ns>:<queue>.msgs  ready messages
--
-- ARGV[1]  delay_ms  delay in ms, added to the server clock
-- ARGV[2]  sort_key  sort key (see key_len.lua)
-- ARGV[3]  message_id
-- ARGV[4]  data  payload (see ready_body.lua)
-- ARGV[5]  look  where a member that already came due is looked for (the offer of a prepared
--          message sent again after its first call's reply was lost): "sent" in KEYS[5]
--          only (the dedupe window covers the client's retry span: a member that moved
--          before the resend is still recorded there), "ready" in KEYS[6] only (no
--          window: while it is queued or in flight), "both" (a client whose retries
--          have no bound), or "" nowhere (a delay longer than every retry of this call
--          by the client: the member cannot have come due before a resend runs)
--
-- As offer.lua: the same member offered again (a resend of this call) moves its due time
-- and stays scheduled once; a member that already came due is not scheduled again.
-- A message id scheduled under another member (a reschedule, which may release a dedupe
-- key the id held) is left to offer.lua: nothing is written and -4 is returned.
--
-- Reads first, then writes: ZRANGE (the head, before this entry) and ZSCORE/HEXISTS (if looked up)
-- type-check KEYS[1] and KEYS[5]/[6]; the first write is the HSETNX of the payload, which
-- also tells a new message id from one already scheduled (one command for the HGET and
-- HSET of the previous release), so a payload hash of the wrong type, or a server at its
-- maxmemory limit (noeviction), fails the call with nothing written. A backup list of the
-- wrong type fails the RPUSH after it: the payload is taken back (pcall), nothing stays.
-- An older ACL rule without HSETNX gets HGET and HSET (scripts/README.md).
--
-- Returns: the due time in epoch ms, -2 when the member had already moved to the ready
--          queue, -4 when the message id is scheduled under another member.

-- include: stored_key.lua

local zset, backup, payloads, channel, sent, ready_msgs = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local sort_key, message_id, data, look = ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local member = sort_key .. message_id

local t = redis.call("TIME")
local due_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + tonumber(ARGV[1])
local head = redis.call("ZRANGE", zset, 0, 0, "WITHSCORES")
-- A member that already came due (this call resent after its reply was lost) is not
-- scheduled again. (It is in neither the schedule nor the payload hash any more, so the
-- order of this read and the HSETNX below does not matter; reading first keeps the
-- type check before the first write.)
if look ~= "" and ((look ~= "ready" and redis.call("ZSCORE", sent, member))
    or (look ~= "sent" and redis.call("HEXISTS", ready_msgs, member) == 1)) then
    return -2
end
local added = redis.pcall("HSETNX", payloads, message_id, sort_key .. data)
if type(added) == "table" then
    if string.find(added.err, "OOM", 1, true) or string.find(added.err, "WRONGTYPE", 1, true) then
        return redis.error_reply(added.err) -- nothing written
    end
    -- Refused (a user on the rule before HSETNX; the calls below raise any other error).
    local stored = redis.call("HGET", payloads, message_id)
    if not stored then
        redis.call("RPUSH", backup, member) -- the first write: a full server refuses it
        redis.call("HSET", payloads, message_id, sort_key .. data)
        added = 2
    elseif stored_key(stored) .. message_id ~= member then
        return -4
    end
end
if added == 0 then
    if stored_key(redis.call("HGET", payloads, message_id)) .. message_id ~= member then
        return -4 -- scheduled under another member (a reschedule: offer.lua)
    end
    -- The same member offered again (this call resent): its due time moves, once scheduled.
elseif added == 1 then
    local pushed = redis.pcall("RPUSH", backup, member)
    if type(pushed) == "table" then
        redis.call("HDEL", payloads, message_id)
        return redis.error_reply(pushed.err)
    end
end
redis.call("ZADD", zset, string.format("%d", due_ms), member)
-- A new earliest entry is announced: before the ZADD the head was later (or there was none).
local head_due = tonumber(head[2])
if not head_due or due_ms < head_due or (due_ms == head_due and member < head[1]) then
    redis.call("PUBLISH", channel, string.format("%d", due_ms))
end
return due_ms
