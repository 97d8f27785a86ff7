-- end_turn(s, group, lane): a weighted lane's turn ends (its "c<lane>" credit goes).
-- include: group_weight.lua
local function end_turn(s, group, lane)
    if group_weight(s, group) > 1 then
        redis.call("HDEL", s.ctx.flow, "c" .. lane)
    end
end
