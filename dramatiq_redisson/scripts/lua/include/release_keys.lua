-- release_keys(keyed, dedupe, holds, throttle_copies, ids, pairs, now_ms): the dedupe keys
-- of messages that left the schedule (transfer.lua): `ids` are their message ids, the
-- moved ones first, then any dead-lettered; `pairs` the moved ones' ready pairs (member,
-- ready body, ...). A key is released (unkey.lua), or, for a moved message whose key has a
-- ttl, held that long more: its end in `holds` and a copy of the moved message in
-- `throttle_copies` (a throttle window; see offer.lua). One EXISTS when the queue has no
-- keyed message.
-- include: unkey.lua
-- include: variadic.lua
-- include: trim_holds.lua
-- include: expire_holds.lua
local function release_keys(keyed, dedupe, holds, throttle_copies, ids, pairs, now_ms)
    local found = unkey(keyed, dedupe, ids)
    local windows, copies = nil, nil
    for i = 1, #pairs / 2 do
        local entry = found[i]
        if entry and entry[1] > 0 then
            windows, copies = windows or {}, copies or {}
            windows[#windows + 1] = now_ms + entry[1]
            windows[#windows + 1] = entry[2]
            copies[#copies + 1] = entry[2]
            copies[#copies + 1] = pairs[2 * i]
        end
    end
    if windows then
        variadic("ZADD", holds, windows)
        variadic("HSET", throttle_copies, copies)
        trim_holds(holds, throttle_copies, now_ms)
        expire_holds(holds, throttle_copies, now_ms)
    end
end
