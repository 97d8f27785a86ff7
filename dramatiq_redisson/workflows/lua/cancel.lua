-- cancel: stop a running workflow: nothing after the steps now running is sent, and its
-- steps not yet started are skipped when they come (workflows/_middleware.py).
--
-- KEYS[1]  workflow  HASH  <ns>:__workflows__.{<ns>:__workflows__}.w:<id>  the workflow (lib.lua)
-- KEYS[2]  index     ZSET  <ns>:__workflows__.{<ns>:__workflows__}.index
-- KEYS[3]  pending   ZSET  <ns>:__workflows__.{<ns>:__workflows__}.pending
-- KEYS[4]  finished  ZSET  <ns>:__workflows__.{<ns>:__workflows__}.finished
--
-- ARGV[1]  id  the workflow's id
-- ARGV[2]  retention  how long (ms) a finished workflow is kept
--
-- Returns: {outcome, state}: outcome "cancelled", "finished" (it had finished: its state
-- is returned) or "gone".

local wf = KEYS[1]
local state = redis.call("HGET", wf, "state")
if not state then
    return { "gone", "" }
end
if state ~= "running" then
    return { "finished", state }
end
local now = wf_now()
redis.call("HSET", wf, "state", "cancelled", "finished", now)
wf_retire(wf, ARGV[1], now, tonumber(ARGV[2]), KEYS[4], KEYS[2])
return { "cancelled", "cancelled" }
