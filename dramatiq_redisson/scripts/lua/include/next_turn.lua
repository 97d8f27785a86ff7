-- next_turn(s, group, lane, ring): a lane that still has ids goes back on its ring: at its
-- head while its weighted turn lasts ("c<lane>" = ids left in its turn), else at its
-- tail. Returns the ring's length.
-- include: group_weight.lua
local function next_turn(s, group, lane, ring)
    local weight = group_weight(s, group)
    if weight > 1 then
        local credit = (tonumber(redis.call("HGET", s.ctx.flow, "c" .. lane)) or weight) - 1
        if credit > 0 then
            redis.call("HSET", s.ctx.flow, "c" .. lane, credit)
            return redis.call("LPUSH", ring, lane) -- the rest of its turn
        end
        redis.call("HDEL", s.ctx.flow, "c" .. lane)
    end
    return redis.call("RPUSH", ring, lane) -- its next turn
end
