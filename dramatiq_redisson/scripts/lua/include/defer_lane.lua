-- defer_lane(s, group, lane): a lane whose group spent its rate waits off its ring, in the
-- ZSET ctx.deferred, until its group may start again (its starts so far logged first);
-- s.deferred_at follows the first (s.deferred_moved: to write).
-- include: log_group_starts.lua
-- include: group_log.lua
-- include: take_clock.lua
local function defer_lane(s, group, lane)
    log_group_starts(s, group)
    local at = s.R.next_start(group_log(s.ctx, group), s.group_rate, s.per_ms, take_clock(s))
    redis.call("ZADD", s.ctx.deferred, at, lane)
    if not s.deferred_at or at < s.deferred_at then
        s.deferred_at = at
        s.deferred_moved = true
    end
end
