-- stats: one queue's counts, read together on the server clock.
--
-- KEYS[1]  ready         LIST  <ns>:<queue>           ready queue
-- KEYS[2]  ready_msgs    HASH  <ns>:<queue>.msgs      data of ready and in-flight messages
-- KEYS[3]  timeout_zset  ZSET  redisson_delay_queue_timeout:{N}   member -> due time (epoch ms)
-- KEYS[4]  xq            ZSET  <ns>:<queue>.XQ        dead letters
-- KEYS[5]  lease         STRING redisson_delay_queue_lease:{N}     "<token> <expiry ms>"
-- KEYS[6]  consumers     ZSET  redisson_delay_queue_consumers:{N}  consumer token -> last seen (epoch ms)
-- KEYS[7]  legacy_dq     LIST  <ns>:<queue>.DQ        the built-in broker's delay queue (not yet migrated)
-- KEYS[8]  paused        STRING redisson_delay_queue_paused:{N}    since when the queue is paused
-- KEYS[9]  flow +lanes   HASH   redisson_delay_queue_flow:{N}      optional, with KEYS[10]: lanes (flow_context.lua)
-- KEYS[10] levels +lanes ZSET   redisson_delay_queue_levels:{N}    the priorities with waiting lanes
--
-- ARGV[1]  grace_ms  overdue grace (ms): entries due more than this long ago count as overdue
-- ARGV[2]  live_ms  consumers seen within this many ms count as live
-- ARGV[3]  ring_prefix +lanes  with KEYS[9..]: the ring prefix (a priority's ring is
--          ARGV[3] .. priority .. "}")
-- ARGV[4]  rate_prefix +lanes  the rate logs' (the lanes waiting for their group's rate are the ZSET
--          ARGV[4] .. "deferred}")
--
-- Cost: O(log n), a fixed number of commands; with lanes, one more per priority that has
-- lanes in its ring (at most max_priority + 1) and a read of 256 counters, whatever the
-- number of groups.
--
-- Returns: {server now (epoch ms), ready, ready + in flight (messages with data in the
--           ready queue's hash), scheduled, overdue, earliest due time or -1, dead,
--           lease holder's token or "", live consumers, built-in delay-queue length,
--           since when the queue is paused (epoch ms; 0: unknown) or -1 if it is not,
--           then, while the queue uses lanes: the lanes waiting off their rings for
--           their group's slot or rate, the lanes in the rings (the plain lane not counted),
--           and for each priority with ids
--           waiting in its lanes but the plain one: priority, that count}
--           (the plain lane is in ring 0 when the ready list holds ids)

local t = redis.call("TIME")
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local grace, live = tonumber(ARGV[1]), tonumber(ARGV[2])
local head = redis.call("ZRANGE", KEYS[3], 0, 0, "WITHSCORES")
local holder = redis.call("GET", KEYS[5])
local paused = redis.call("GET", KEYS[8])
local reply = {
    now_ms,
    redis.call("LLEN", KEYS[1]),
    redis.call("HLEN", KEYS[2]),
    redis.call("ZCARD", KEYS[3]),
    redis.call("ZCOUNT", KEYS[3], "-inf", "(" .. (now_ms - grace)),
    head[2] and tonumber(head[2]) or -1,
    redis.call("ZCARD", KEYS[4]),
    holder and string.match(holder, "^(.*) %d+$") or "",
    redis.call("ZCOUNT", KEYS[6], now_ms - live, "+inf"),
    redis.call("LLEN", KEYS[7]),
    paused and (tonumber(paused) or 0) or -1,
}
if KEYS[9] and redis.call("EXISTS", KEYS[9]) == 1 then
    local off_ring = tonumber(redis.call("HGET", KEYS[9], "blocked") or 0)
    if ARGV[4] then
        off_ring = off_ring + redis.call("ZCARD", ARGV[4] .. "deferred}")
    end
    reply[#reply + 1] = off_ring
    local lanes = redis.call("HEXISTS", KEYS[9], "plain") == 1 and -1 or 0 -- the plain lane is none
    for _, priority in ipairs(redis.call("ZRANGE", KEYS[10], 0, -1)) do
        lanes = lanes + redis.call("LLEN", ARGV[3] .. priority .. "}")
    end
    reply[#reply + 1] = math.max(0, lanes)
    -- Every priority's count in one read: a lane off its ring for its group's limit is in no
    -- ring, so `levels` does not name every priority with waiting ids.
    local fields = {}
    for priority = 0, 255 do
        fields[#fields + 1] = "p" .. priority
    end
    local counts = redis.call("HMGET", KEYS[9], unpack(fields))
    for i = 1, #counts do
        local n = tonumber(counts[i] or 0)
        if n and n > 0 then
            reply[#reply + 1] = i - 1
            reply[#reply + 1] = n
        end
    end
end
return reply
