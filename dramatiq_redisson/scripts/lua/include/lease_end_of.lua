-- lease_end_of(value): when the lease of that value ends (epoch ms), or nil.
--
-- The transfer lease (included by transfer.lua). One consumer per queue runs the
-- transfers: the lease (a STRING "<token> <expiry ms>", PX) names it. Every caller is
-- recorded as seen in the consumers ZSET (consumer token -> last seen, epoch ms), so
-- that a standby that stops calling drops out.
local function lease_end_of(value)
    return value and tonumber(string.match(value, " (%d+)$"))
end
