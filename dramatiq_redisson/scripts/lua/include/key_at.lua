-- key_at(ms): the sort key of millisecond ms with counter 0 (a periodic tick's;
-- _ids.sort_key_at): the top 11 hex digits are ms * 4, the first of them moved up to
-- g..v, then "000".
local function key_at(ms)
    local top = string.format("%011x", ms * 4)
    return string.char(103 + tonumber(string.sub(top, 1, 1), 16)) .. string.sub(top, 2) .. "000"
end
