-- _lease.lua: the transfer lease, functions included by transfer.lua (see
-- _script_runner.py), not a script of its own.
--
-- One consumer per queue runs the transfers: the lease (a STRING "<token> <expiry ms>",
-- PX) names it. Every caller is recorded as seen in the consumers ZSET (consumer token
-- -> last seen, epoch ms), so that a standby that stops calling drops out.
--
-- lease_other(value, token): for the lease's current value and the caller's token:
--   nil when the caller may transfer (no holder, or the caller holds it), else the
--   holder's token and when its lease ends (epoch ms, or nil when unreadable).
-- lease_end_of(value): when the lease of that value ends (epoch ms), or nil.
-- lease_seen(consumers, token, now_ms): record the caller as seen now (a ZREM first,
--   which never grows memory: fine as a script's first write).
-- lease_renew(lease, consumers, token, lease_end, lease_ms, now_ms): the holder renews
--   at its first call a third of a lease after the last renewal (it calls at least
--   every third of a lease, so a lease never runs below a third), not on every due time;
--   consumers not seen for three leases are dropped from the registry (a standby checks
--   about once a lease).

local function lease_end_of(value)
    return value and tonumber(string.match(value, " (%d+)$"))
end

local function lease_other(value, token)
    if not value or string.sub(value, 1, #token + 1) == token .. " " then
        return nil
    end
    return string.match(value, "^(.*) %d+$") or value, lease_end_of(value)
end

local function lease_seen(consumers, token, now_ms)
    redis.call("ZREM", consumers, token)
    redis.call("ZADD", consumers, now_ms, token)
end

local function lease_renew(lease, consumers, token, lease_end, lease_ms, now_ms)
    if lease_end and lease_end - now_ms >= lease_ms * 2 / 3 then
        return
    end
    lease_seen(consumers, token, now_ms)
    redis.call("SET", lease, token .. " " .. (now_ms + lease_ms), "PX", lease_ms)
    redis.call("ZREMRANGEBYSCORE", consumers, "-inf", "(" .. (now_ms - 3 * lease_ms))
end
