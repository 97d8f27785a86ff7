-- variadic(command, key, items): redis.call(command, key, <items>) over many items (HSET,
-- ZADD, RPUSH, ...), in chunks of CHUNK items: Lua's unpack() puts every item on the
-- stack, and one call per CHUNK stays far below its limit whatever the batch size.
--   Returns: the sum of the integer replies (0 for a command that replies otherwise).
local CHUNK = 1000

local function variadic(command, key, items)
    local total = 0
    for i = 1, #items, CHUNK do
        local reply = redis.call(command, key, unpack(items, i, math.min(#items, i + CHUNK - 1)))
        if type(reply) == "number" then
            total = total + reply
        end
    end
    return total
end
