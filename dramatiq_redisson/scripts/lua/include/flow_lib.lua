-- flow_lib(): the flow's functions that only a queue with lanes calls, made on first use
-- and kept for the rest of the script call: defining them costs a script call about 6 µs,
-- which a queue without lanes must not pay. Its fields (each in its own file):
--   push = flow_push, take = flow_take, use_slots = flow_use_slots, enable = flow_enable,
--   record = fetch_record, release = flow_release,
--   unblock_all = flow_unblock_all, put_back = flow_put_back, and live_starts (rate_lib's,
--   made on its first use too).
local flow_lib_made = nil

local function flow_lib()
    if flow_lib_made then
        return flow_lib_made
    end
    -- include: flow_push.lua
    -- include: flow_take.lua
    -- include: flow_use_slots.lua
    -- include: flow_enable.lua
    -- include: fetch_record.lua
    -- include: flow_release.lua
    -- include: flow_unblock_all.lua
    -- include: flow_put_back.lua
    flow_lib_made = {
        push = flow_push,
        take = flow_take,
        use_slots = flow_use_slots,
        enable = flow_enable,
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
