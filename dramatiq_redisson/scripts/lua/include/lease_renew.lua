-- lease_renew(lease, consumers, token, lease_end, lease_ms, now_ms): the holder renews
--   at its first call a third of a lease after the last renewal (it calls at least
--   every third of a lease, so a lease never runs below a third), not on every due time;
--   consumers not seen for three leases are dropped from the registry (a standby checks
--   about once a lease).
-- include: lease_seen.lua
local function lease_renew(lease, consumers, token, lease_end, lease_ms, now_ms)
    if lease_end and lease_end - now_ms >= lease_ms * 2 / 3 then
        return
    end
    lease_seen(consumers, token, now_ms)
    redis.call("SET", lease, token .. " " .. (now_ms + lease_ms), "PX", lease_ms)
    redis.call("ZREMRANGEBYSCORE", consumers, "-inf", "(" .. (now_ms - 3 * lease_ms))
end
