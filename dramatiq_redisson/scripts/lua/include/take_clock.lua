-- take_clock(s): the server's clock (ms) for a take (s: flow_take's state), read once and
-- only when a rate needs it.
local function take_clock(s)
    if not s.now then
        local t = redis.call("TIME")
        s.now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    end
    return s.now
end
