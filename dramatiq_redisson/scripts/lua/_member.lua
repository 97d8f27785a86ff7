-- _member: a member is a sort key followed by the message id; a stored payload starts
-- with its member's sort key. A key of this release has 14 characters and starts with one
-- of g..v; earlier releases wrote 16 hex characters (see _ids.py, which this mirrors).
local function key_len(text)
    local first = string.byte(text, 1)
    if first and first >= 103 then
        return 14
    end
    return 16
end

-- The message id of a member.
local function message_id_of(member)
    return string.sub(member, key_len(member) + 1)
end

-- The sort key a stored payload starts with.
local function stored_key(stored)
    return string.sub(stored, 1, key_len(stored))
end

-- The millisecond a sort key of this release was taken at: its 42 bits above a 14-bit
-- counter (the top 11 hex digits hold 44 bits: exact in a Lua number).
local function key_ms(member)
    local top = (string.byte(member, 1) - 103) * 16 ^ 10 + tonumber(string.sub(member, 2, 11), 16)
    return math.floor(top / 4)
end

-- The sort key of millisecond ms with counter 0 (a periodic tick's; _ids.sort_key_at): the
-- top 11 hex digits are ms * 4, the first of them moved up to g..v, then "000".
local function key_at(ms)
    local top = string.format("%011x", ms * 4)
    return string.char(103 + tonumber(string.sub(top, 1, 1), 16)) .. string.sub(top, 2) .. "000"
end
