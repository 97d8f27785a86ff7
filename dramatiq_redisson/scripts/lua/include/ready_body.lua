-- ready_body: the ready copy of a scheduled payload (the payload hash's value after its
-- sort key: see key_len.lua). Mirrored by ready_body() in _message.py; tests/test_compact_payload.py
-- checks that the two agree byte for byte.
--
-- ready_body(member, body, queue_json) -> the encoded message the ready queue stores:
--   "\30" actor "\30" args "\30" kwargs "\30" options "\30" timestamp
--          a compact payload (encode_scheduled, Dramatiq's JSON encoder): the JSON text
--          of each field, the actor's name without its quotes, options without
--          redis_message_id; empty kwargs and options as nothing ("{}"), an int
--          timestamp as "@" and its difference to the member's sort key millisecond. The JSON message is written back with queue_name
--          (queue_json: the queue's name as a JSON string), message_id (the member after
--          its sort key) and redis_message_id (the member, first among the options),
--          in Message.asdict's field order. JSON text never holds a raw "\30" (byte
--          0x1e: control characters are escaped in strings), so the fields split on it.
--   "\30\30" raw
--          raw, as another encoder wrote it (its bytes began with "\30")
--   anything else
--          as stored (a payload of an earlier release, or another encoder); a JSON one
--          without redis_message_id gets it right after "options":{
-- include: key_ms.lua
-- include: message_id_of.lua

local RS = "\30"

local function ready_body(member, body, queue_json)
    if string.sub(body, 1, 1) == RS then
        if string.sub(body, 2, 2) == RS then
            return string.sub(body, 3)
        end
        local a = string.find(body, RS, 2, true)
        local b = a and string.find(body, RS, a + 1, true)
        local c = b and string.find(body, RS, b + 1, true)
        local d = c and string.find(body, RS, c + 1, true)
        if d then
            local options = string.sub(body, c + 1, d - 1)
            local rmid = '{"redis_message_id":"' .. member .. '"'
            if options == "" or options == "{}" then
                options = rmid .. "}"
            else
                options = rmid .. "," .. string.sub(options, 2)
            end
            local kwargs = string.sub(body, b + 1, c - 1)
            if kwargs == "" then
                kwargs = "{}"
            end
            local stamp = string.sub(body, d + 1)
            if string.sub(stamp, 1, 1) == "@" then
                stamp = string.format("%d", key_ms(member) + tonumber(string.sub(stamp, 2)))
            end
            return '{"queue_name":' .. queue_json
                .. ',"actor_name":"' .. string.sub(body, 2, a - 1)
                .. '","args":' .. string.sub(body, a + 1, b - 1)
                .. ',"kwargs":' .. kwargs
                .. ',"options":' .. options
                .. ',"message_id":"' .. message_id_of(member)
                .. '","message_timestamp":' .. stamp
                .. "}"
        end
        return body -- not a compact payload after all: delivered as stored (it fails to decode there, logged)
    end
    if not string.find(body, '"redis_message_id":"', 1, true) then
        local _, open = string.find(body, '"options":{', 1, true)
        if open then
            local rmid = '"redis_message_id":"' .. member .. '"'
            if string.sub(body, open + 1, open + 1) ~= "}" then
                rmid = rmid .. ","
            end
            return string.sub(body, 1, open) .. rmid .. string.sub(body, open + 1)
        end
    end
    return body
end
