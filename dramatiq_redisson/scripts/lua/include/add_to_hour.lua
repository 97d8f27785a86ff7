-- add_to_hour(hours, hour, counts): add counts {processed, failed, retried} to the hour
-- slot of `hour`; a slot left from a lap before (another stamp) starts again from these
-- counts (record_history.lua has the layout).
-- include: history_hour_at.lua
local function add_to_hour(hours, hour, counts)
    local hour_at = history_hour_at(hour)
    if redis.call("BITFIELD", hours, "GET", "u32", hour_at)[1] == hour then
        redis.call("BITFIELD", hours, "OVERFLOW", "SAT", "INCRBY", "u32", hour_at + 32, counts[1],
            "INCRBY", "u32", hour_at + 64, counts[2], "INCRBY", "u32", hour_at + 96, counts[3])
    else
        redis.call("BITFIELD", hours, "SET", "u32", hour_at, hour, "SET", "u32", hour_at + 32, counts[1],
            "SET", "u32", hour_at + 64, counts[2], "SET", "u32", hour_at + 96, counts[3])
    end
end
