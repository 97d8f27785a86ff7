-- lease_seen(consumers, token, now_ms): record the caller as seen now (a ZREM first,
--   which never grows memory: fine as a script's first write).
local function lease_seen(consumers, token, now_ms)
    redis.call("ZREM", consumers, token)
    redis.call("ZADD", consumers, now_ms, token)
end
