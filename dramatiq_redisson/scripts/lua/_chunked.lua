-- _chunked.lua: functions included by offer.lua, transfer.lua, enqueue.lua and _dedupe.lua
-- (see _script_runner.py), not a script of its own.
--
-- A variadic command (HSET, ZADD, RPUSH, HMGET, ...) over many items goes in chunks of
-- CHUNK items: Lua's unpack() puts every item on the stack, and one call per CHUNK
-- stays far below its limit whatever the batch size.
--
-- variadic(command, key, items): redis.call(command, key, <items>) chunk by chunk.
--   Returns: the sum of the integer replies (0 for a command that replies otherwise).
-- gather(command, key, items): the same, for a command that replies one value per
--   item (HMGET, ZMSCORE).
--   Returns: the replies, in the order of items, as one array.
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
