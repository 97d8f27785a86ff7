-- more_waiting(s): whether ready ids wait in turn (read once, and only when it decides
-- something).
local function more_waiting(s)
    if s.more_known == nil then
        s.more_known = redis.call("ZCARD", s.ctx.levels) > 0 or redis.call("LLEN", s.ctx.ready) > 0
    end
    return s.more_known
end
