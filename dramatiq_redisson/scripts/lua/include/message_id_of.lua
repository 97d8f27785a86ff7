-- message_id_of(member): the message id of a member (after its sort key).
-- include: key_len.lua
local function message_id_of(member)
    return string.sub(member, key_len(member) + 1)
end
