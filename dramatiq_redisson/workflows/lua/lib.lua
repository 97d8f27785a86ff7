-- The functions the workflow scripts share, written in front of each of them when it is
-- loaded (workflows/_scripts.py). A workflow's HASH (see workflows/_store.py for the
-- whole layout) holds, per node of its tree, numbered in preorder (0: the root):
--   "m:<n>"  a step: its encoded message, as it is sent
--   "n:<n>"  a chain or a group: JSON {"k": "c"|"g", "p": parent, "pk": parent's kind,
--            "n": the spec of the node after it in its chain or "", "c": the specs of
--            its members, "f": a group's "fail" or "continue"}
--   "c:<n>"  a group: how many of its members have not finished
--   "d:<n>"  a node that finished: "<1|0>|<when, epoch ms>|<how long it ran, ms>|<result JSON>"
-- A spec names a node and its kind: "m5" (a step), "c2" (a chain), "g7" (a group).

local function wf_now()
    local t = redis.call("TIME")
    return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- Whether a "d:" record says the node succeeded, and its result (JSON).
local function wf_parse_done(value)
    local a = string.find(value, "|", 1, true)
    local b = string.find(value, "|", a + 1, true)
    local c = string.find(value, "|", b + 1, true)
    return string.sub(value, 1, 1) == "1", string.sub(value, c + 1)
end

local function wf_done_record(ok, now, took, result)
    return (ok and "1|" or "0|") .. now .. "|" .. took .. "|" .. result
end

local function wf_def(wf, number)
    return cjson.decode(redis.call("HGET", wf, "n:" .. number))
end

-- Appends to `starts` (spec, input pairs) the steps that run first when node `spec`
-- starts with `input` (JSON, or "": none): a step itself, a chain's first node, every
-- member of a group.
local function wf_start(wf, spec, input, starts)
    local kind = string.sub(spec, 1, 1)
    if kind == "m" then
        starts[#starts + 1] = spec
        starts[#starts + 1] = input
        return
    end
    local def = wf_def(wf, string.sub(spec, 2))
    if kind == "c" then
        wf_start(wf, def.c[1], input, starts)
    else
        for i = 1, #def.c do
            wf_start(wf, def.c[i], input, starts)
        end
    end
end

-- The reply's sends: for each (spec, input) pair of `starts`, the spec, the step's encoded
-- message and the input; with `unfinished`, only the steps with no "d:" record (a replay:
-- those that finished started what follows them themselves).
local function wf_sends(wf, starts, reply, unfinished)
    for i = 1, #starts, 2000 do
        local fields = {}
        for j = i, math.min(#starts, i + 1999), 2 do
            local number = string.sub(starts[j], 2)
            fields[#fields + 1] = "m:" .. number
            if unfinished then
                fields[#fields + 1] = "d:" .. number
            end
        end
        local values = redis.call("HMGET", wf, unpack(fields))
        local width = unfinished and 2 or 1
        for k = 1, #values, width do
            local j = i + (k - 1) / width * 2
            if values[k] and not (unfinished and values[k + 1]) then
                reply[#reply + 1] = starts[j]
                reply[#reply + 1] = values[k]
                reply[#reply + 1] = starts[j + 1]
            end
        end
    end
    return reply
end

-- A finished (done, failed or cancelled) workflow: kept `retention` ms more, then gone;
-- the finished ones older than that leave the indexes (at most 100 per call). (The
-- pending index is left to the run's caller and the sweep, which drop it.)
local function wf_retire(wf, id, now, retention, finished, index)
    redis.call("ZADD", finished, now, id)
    if retention > 0 then
        redis.call("PEXPIRE", wf, retention)
    else
        redis.call("DEL", wf)
    end
    local old = redis.call("ZRANGEBYSCORE", finished, "-inf", now - retention, "LIMIT", 0, 100)
    if #old > 0 then
        redis.call("ZREM", finished, unpack(old))
        redis.call("ZREM", index, unpack(old))
    end
end
