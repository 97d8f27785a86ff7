-- step: record that a step of a workflow finished (it succeeded, or failed for good), and
-- return the steps that start because of it, which the caller sends. A step recorded
-- before (it ran again: a redelivery after a kill, a lost reply) changes nothing and
-- returns again what its record started, less what has finished since.
--
-- KEYS[1]  workflow  HASH  <ns>:__workflows__.{<ns>:__workflows__}.w:<id>  the workflow (lib.lua)
-- KEYS[2]  index     ZSET  <ns>:__workflows__.{<ns>:__workflows__}.index
-- KEYS[3]  pending   ZSET  <ns>:__workflows__.{<ns>:__workflows__}.pending
-- KEYS[4]  finished  ZSET  <ns>:__workflows__.{<ns>:__workflows__}.finished
--
-- ARGV[1]  id  the workflow's id
-- ARGV[2]  node  the step's node number
-- ARGV[3]  ok  "1": it succeeded; "0": it failed for good
-- ARGV[4]  result  its return value as JSON ("null" when it failed)
-- ARGV[5]  took  how long it ran (ms)
-- ARGV[6]  parent  its parent's node number, -1 for a workflow of one step
-- ARGV[7]  parent_kind  its parent's kind: "c" (a chain) or "g" (a group)
-- ARGV[8]  following  the spec of the node after it in its chain, or ""
-- ARGV[9]  retention  how long (ms) a finished workflow is kept
-- ARGV[10]  now?  the caller's estimate of this server's clock (epoch ms; absent or "": TIME)
--
-- Returns: {outcome, ended, spec, message, input, ...}: outcome "recorded", "again" or "gone"
-- (no such workflow: it expired); ended: "done" or "failed" when this call finished the
-- workflow, else ""; then the steps to send, three values each (input "": none). Nothing
-- is returned to send unless the workflow is running (not cancelled, not failed).
--
-- Commands: a chain's step that starts the step after it runs HMGET (the state, its record
-- and the next step's message at once) and HSET; a group's member HSETNX (its record,
-- once) and HINCRBY (the group's count), and the last one to finish reads the state, the
-- group and its members' records. TIME only when the caller has no estimate of the clock.
--
-- Memory: its first write (HSET) grows memory: on a full server it is refused whole, the
-- caller does not ack the step, and it runs again later.

local wf, index, pending, finished = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local id, node, ok = ARGV[1], ARGV[2], ARGV[3] == "1"
local result, took = ARGV[4], tonumber(ARGV[5]) or 0
local parent, parent_kind, following = tonumber(ARGV[6]), ARGV[7], ARGV[8]
local retention = tonumber(ARGV[9])
local now = tonumber(ARGV[10] or "") or wf_now()

local state, replay, next_message
local counted = false -- a group's member whose record already counted the group down
if parent_kind == "g" then
    if redis.call("HSETNX", wf, "d:" .. node, wf_done_record(ok, now, took, result)) == 1 then
        local left = redis.call("HINCRBY", wf, "c:" .. parent, -1)
        if left < 0 then
            redis.call("DEL", wf) -- no such workflow: the two writes above made it
            return { "gone", "" }
        end
        if left > 0 then
            return { "recorded", "" }
        end
        counted, replay = true, false
        state = redis.call("HGET", wf, "state")
    else
        local head = redis.call("HMGET", wf, "state", "d:" .. node)
        state, replay = head[1], true
        ok, result = wf_parse_done(head[2])
    end
else
    local fields = { "state", "d:" .. node }
    if ok and parent_kind == "c" and string.sub(following, 1, 1) == "m" then
        fields[3] = "m:" .. string.sub(following, 2)
    end
    local head = redis.call("HMGET", wf, unpack(fields))
    state = head[1]
    if not state then
        return { "gone", "" }
    end
    replay = head[2] and true or false
    if replay then
        ok, result = wf_parse_done(head[2])
    else
        next_message = head[3]
        redis.call("HSET", wf, "d:" .. node, wf_done_record(ok, now, took, result))
    end
end

-- Walk up from the step: each finished node starts what follows it in its chain, or
-- finishes its chain, or counts down its group (the last member finishes the group).
local starts, ended = {}, ""
local p, pk, nxt = parent, parent_kind, following
while true do
    if p < 0 then
        if not replay and state == "running" then
            ended = ok and "done" or "failed"
            redis.call("HSET", wf, "state", ended, "finished", now)
            wf_retire(wf, id, now, retention, finished, index)
        end
        break
    end
    if pk == "c" and ok and nxt ~= "" then
        if next_message then
            starts = { nxt, result } -- the next step's message came with the state
        else
            wf_start(wf, nxt, result, starts)
        end
        break
    end
    local def
    if replay then
        local done = redis.call("HGET", wf, "d:" .. p)
        if not done then
            break
        end
        ok, result = wf_parse_done(done)
        def = wf_def(wf, p)
    elseif pk == "c" then
        def = wf_def(wf, p) -- the chain's last node finished, or one failed: so did the chain
        redis.call("HSET", wf, "d:" .. p, wf_done_record(ok, now, 0, result))
    else
        if counted then
            counted = false
        elseif redis.call("HINCRBY", wf, "c:" .. p, -1) > 0 then
            break
        end
        def = wf_def(wf, p)
        local members = {}
        for i = 1, #def.c do
            members[i] = "d:" .. string.sub(def.c[i], 2)
        end
        local results, failed = {}, false
        for i = 1, #members, 4000 do
            local done = redis.call("HMGET", wf, unpack(members, i, math.min(#members, i + 3999)))
            for j = 1, #done do
                local member_ok, member_result = false, "null"
                if done[j] then
                    member_ok, member_result = wf_parse_done(done[j])
                end
                results[#results + 1] = member_ok and member_result or "null"
                failed = failed or not member_ok
            end
        end
        ok = not (failed and def.f == "fail")
        result = "[" .. table.concat(results, ",") .. "]"
        redis.call("HSET", wf, "d:" .. p, wf_done_record(ok, now, 0, result))
    end
    p, pk, nxt = def.p, def.pk, def.n
end

local reply = { replay and "again" or "recorded", ended }
if state ~= "running" or #starts == 0 then
    return reply
end
if next_message then
    reply[3], reply[4], reply[5] = starts[1], next_message, starts[2]
    return reply
end
return wf_sends(wf, starts, reply, replay)
