-- key_ms(member): the millisecond a sort key of this release was taken at: its 42 bits
-- above a 14-bit counter (the top 11 hex digits hold 44 bits: exact in a Lua number).
local function key_ms(member)
    local top = (string.byte(member, 1) - 103) * 16 ^ 10 + tonumber(string.sub(member, 2, 11), 16)
    return math.floor(top / 4)
end
