-- flow_context(ready, flow, levels, lane_of, lane_prefix, ring_prefix, rate_prefix): the
-- keys of a queue's lanes and their rings, as one table (rate_prefix: fetch.lua and
-- limits.lua only). A lane's list is lane_prefix .. id .. "}", a ring ring_prefix ..
-- priority .. "}", the flag lane_prefix .. "on}" (the prefixes come from _keys.py in ARGV:
-- they are not keys).
--
-- Lanes and their rings are used for a queue whose `flow` key exists (a priority, a
-- group or a limit was used; see docs/flow-control-design.md), by the scripts that push
-- ready messages and by fetch.lua.
--
-- A lane is the ready list of one (priority, group), its id "<priority>:<group as hex>";
-- lane "0:" is the queue's ready list itself, so a message with neither a priority nor a
-- group goes where it always went. A lane with ids is in its priority's ring (a LIST of
-- lane ids, taken in turn) exactly once; a priority with a non-empty ring is in `levels`
-- (ZSET, score = priority). The plain lane joins ring 0 in the fetch (take), not where
-- ids are pushed onto the ready list: a send or a move of plain messages then needs no
-- look at the flow, and a queue that uses no lanes pays nothing for them.
--
-- The flow's flag is a STRING (lane_prefix .. "on}", _keys.flow_flag), so that the scripts
-- on the hot path read it in the MGET of their other strings: fetch.lua with the pause,
-- transfer.lua with its lease and cursor.
--
-- The flow key is a HASH ("on" = 1 in it is what releases before issue 56 wrote with the
-- flag, which alone now says the flow is on: flow_enable.lua): "plain" = 1 while the plain
-- lane is in ring 0, and "p<priority>" = how
-- many ids wait in the lanes of that priority but the plain one (whose count is the ready
-- list's length): stats.lua reads them with a command per priority, whatever the number of
-- groups. A push or a take changes them with one HINCRBY per priority per call. It also
-- keeps the limits ("concurrency", "group_concurrency", "rate", "per_ms", "group_rate"),
-- the concurrency slots in use ("inuse", "g<group>", "groups"), the lanes waiting for their group's
-- concurrency slot ("b<group>", "blocked"), the rates' sleeper ("rate_at", "rate_waiter") and first
-- deferred lane ("deferred_at"), and the group weights ("w<group>", "weights": how many;
-- "c<lane>": ids left in a weighted lane's turn). <group> is the group name as hex.
--
-- Defined at once (cheap, used on plain paths too): flow_context, flow_on (flow_on.lua),
-- record_lane (record_lane.lua); the rest is made on first use, as flow_lib().<name>
-- (flow_lib.lua).
local function flow_context(ready, flow, levels, lane_of, lane_prefix, ring_prefix, rate_prefix)
    return {
        ready = ready, flow = flow, levels = levels, lane_of = lane_of,
        lane_prefix = lane_prefix, ring_prefix = ring_prefix,
        flag = lane_prefix and (lane_prefix .. "on}"),
        rate_prefix = rate_prefix, -- fetch.lua and limits.lua only (rates: rate_lib.lua)
        deferred = rate_prefix and (rate_prefix .. "deferred}"),
    }
end
