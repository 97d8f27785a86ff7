-- key_len(text): the length of the sort key that a member (or a stored payload) starts
-- with. A member is a sort key followed by the message id; a stored payload starts with
-- its member's sort key. A key of this release has 14 characters and starts with one of
-- g..v; earlier releases wrote 16 hex characters (see _ids.py, which this mirrors).
local function key_len(text)
    local first = string.byte(text, 1)
    if first and first >= 103 then
        return 14
    end
    return 16
end
