-- scan: one page of scheduled messages in due order, after a cursor, with their payloads.
--
-- KEYS[1]  timeout_zset ZSET  redisson_delay_queue_timeout:{N}   member -> due time (epoch ms)
-- KEYS[2]  payloads     HASH  redisson_delay_queue_msgs:{N}      message id -> sort key .. encoded message
--
-- ARGV[1]  size  page size
-- ARGV[2]  due  the cursor: the due time of the last entry of the previous page, or "" to
--          start at the head
-- ARGV[3]  member  the member of that entry
--
-- Entries come in ZSET order (due time, then member: the member starts with its offer
-- sort key, so equal due times keep offer order). While the cursor's entry is still
-- scheduled at its due time the page starts right after its rank. Once it moved (or
-- was rescheduled or cancelled) the page starts at the first entry after its place: a
-- binary search by rank among the entries of its due time.
--
-- Cost: O(log n + page size) per call; O(log² n) when the cursor's entry is gone.
--
-- Returns: {flat list member1, due1, payload1, member2, ... (payload false if it was
--           gone), cursor due time, cursor member} — the cursor is the page's last
--           entry ("" when the end was reached).
-- returns: {entries, next_due, next_member}

-- include: message_id_of.lua

local zset, payloads = KEYS[1], KEYS[2]
local size, after_due, after_member = tonumber(ARGV[1]), ARGV[2], ARGV[3]

local entries
if after_due == "" then
    entries = redis.call("ZRANGE", zset, 0, size - 1, "WITHSCORES")
else
    local rank = redis.call("ZRANK", zset, after_member)
    local score = rank and redis.call("ZSCORE", zset, after_member)
    if rank and tonumber(score) == tonumber(after_due) then
        entries = redis.call("ZRANGE", zset, rank + 1, rank + size, "WITHSCORES")
    else
        -- Binary search, among the entries of the cursor's due time (ranks lo .. hi - 1,
        -- ordered by member), for the first member after the cursor's.
        local lo = redis.call("ZCOUNT", zset, "-inf", "(" .. after_due)
        local hi = redis.call("ZCOUNT", zset, "-inf", after_due)
        while lo < hi do
            local mid = math.floor((lo + hi) / 2)
            if redis.call("ZRANGE", zset, mid, mid)[1] > after_member then
                hi = mid
            else
                lo = mid + 1
            end
        end
        entries = redis.call("ZRANGE", zset, lo, lo + size - 1, "WITHSCORES")
    end
end
if #entries == 0 then
    return {{}, "", ""}
end
local message_ids = {}
for i = 1, #entries, 2 do
    message_ids[#message_ids + 1] = message_id_of(entries[i])
end
local stored = redis.call("HMGET", payloads, unpack(message_ids))
local page = {}
for i = 1, #message_ids do
    local member, data = entries[2 * i - 1], stored[i]
    page[#page + 1] = member
    page[#page + 1] = entries[2 * i]
    page[#page + 1] = data
end
if #entries < 2 * size then
    return {page, "", ""}
end
return {page, entries[#entries], entries[#entries - 1]}
