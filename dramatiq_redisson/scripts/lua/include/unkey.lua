-- unkey(keyed, dedupe, ids): the message ids leave the schedule (moved, cancelled,
-- removed, rescheduled without their key): their entries leave both hashes. A key whose
-- index entry names another message (it cannot, but never drop someone else's) stays.
-- Returns, by position in ids, {ttl, key} for each id that had a key. O(#ids); one
-- EXISTS when the queue has no keyed message.
-- include: dedupe_split.lua
-- include: gather.lua
local function unkey(keyed, dedupe, ids)
    local found = {}
    if #ids == 0 or redis.call("EXISTS", keyed) == 0 then
        return found
    end
    local values = gather("HMGET", keyed, ids)
    local gone_ids, gone_keys = {}, {}
    for i = 1, #ids do
        if values[i] then
            local ttl, key = dedupe_split(values[i])
            found[i] = { ttl, key }
            gone_ids[#gone_ids + 1] = ids[i]
            gone_keys[#gone_keys + 1] = key
        end
    end
    if #gone_ids > 0 then
        gather("HDEL", keyed, gone_ids)
        local owners = gather("HMGET", dedupe, gone_keys)
        local drop = {}
        for j = 1, #gone_keys do
            if owners[j] == gone_ids[j] then
                drop[#drop + 1] = gone_keys[j]
            end
        end
        if #drop > 0 then
            gather("HDEL", dedupe, drop)
        end
    end
    return found
end
