-- gather(command, key, items): variadic() for a command that replies one value per item
-- (HMGET, ZMSCORE), in chunks of CHUNK items (variadic.lua).
--   Returns: the replies, in the order of items, as one array.
-- include: variadic.lua
local function gather(command, key, items)
    local result = {}
    for i = 1, #items, CHUNK do
        local part = redis.call(command, key, unpack(items, i, math.min(#items, i + CHUNK - 1)))
        if type(part) == "table" then
            for j = 1, #part do
                result[i + j - 1] = part[j]
            end
        end
    end
    return result
end
