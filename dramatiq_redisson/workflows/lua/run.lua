-- run: record a workflow, whose first steps the caller then sends (it knows them: the
-- steps that start the tree); or, for a workflow already recorded, return those of its
-- first steps that have not finished (a resend of a call whose reply was lost; the sweep
-- of a caller that died before it sent them).
--
-- KEYS[1]  workflow  HASH  <ns>:__workflows__.{<ns>:__workflows__}.w:<id>  the workflow (lib.lua)
-- KEYS[2]  index     ZSET  <ns>:__workflows__.{<ns>:__workflows__}.index   id -> when it started (epoch ms,
--                          to the µs)
-- KEYS[3]  pending   ZSET  <ns>:__workflows__.{<ns>:__workflows__}.pending id -> when it started, until
--                          its caller sent its first steps
-- KEYS[4]  finished  ZSET  <ns>:__workflows__.{<ns>:__workflows__}.finished id -> when it finished
--
-- ARGV[1]  id  the workflow's id
-- ARGV[2]  root?  the spec of its root node (absent: only the replay of a recorded one)
-- ARGV[3]  steps?  how many steps it has
-- ARGV[4..]  nodes  "m:<n>", "n:<n>" and "c:<n>" fields and their values (lib.lua)
--
-- Returns: {outcome, state, created, spec, message, input, ...}: outcome "recorded", "again" or
-- "gone" (a replay of a workflow that no longer exists); its state; when it started (epoch
-- ms, server clock); then, for "again" only, the steps to send, three values each (input
-- "": none).
--
-- Memory: its first write (HSET) grows memory: on a full server nothing is written.

local wf, index, pending = KEYS[1], KEYS[2], KEYS[3]
local id, root = ARGV[1], ARGV[2]

local head = redis.call("HMGET", wf, "state", "created", "root")
if head[1] then
    local reply = { "again", head[1], tonumber(head[2]) }
    if head[1] ~= "running" then
        return reply
    end
    local starts = {}
    wf_start(wf, head[3], "", starts)
    return wf_sends(wf, starts, reply, true)
end
if not root then
    redis.call("ZREM", pending, id)
    return { "gone", "", 0 }
end

local t = redis.call("TIME")
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call("HSET", wf, "state", "running", "created", now, "root", root, "steps", ARGV[3])
for i = 4, #ARGV, 2000 do
    redis.call("HSET", wf, unpack(ARGV, i, math.min(#ARGV, i + 1999)))
end
redis.call("ZADD", index, tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000, id) -- µs apart: listed in order
redis.call("ZADD", pending, now, id)
return { "recorded", "running", now }
