-- stored_key(stored): the sort key a stored payload starts with.
-- include: key_len.lua
local function stored_key(stored)
    return string.sub(stored, 1, key_len(stored))
end
