-- lease_other(value, token): for the lease's current value and the caller's token:
--   nil when the caller may transfer (no holder, or the caller holds it), else the
--   holder's token and when its lease ends (epoch ms, or nil when unreadable).
-- include: lease_end_of.lua
local function lease_other(value, token)
    if not value or string.sub(value, 1, #token + 1) == token .. " " then
        return nil
    end
    return string.match(value, "^(.*) %d+$") or value, lease_end_of(value)
end
