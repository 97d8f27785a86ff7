-- backup_upkeep: the backup list's upkeep (included by transfer.lua).
--
-- The backup list (offer order) keeps entries that are no longer scheduled until they
-- leave from its head, or until a compaction pass rebuilds it: never an LREM per entry.
--
-- backup_upkeep(zset, backup, compact, cursor_key, cursor, wrote, trim_budget,
--               compact_step, slack, upkeep_ms)
--   cursor: the value of cursor_key: "-" between upkeep ticks (nothing to do), a read
--   position while a compaction pass runs (it copies the next compact_step entries that
--   are still scheduled, in order, to the compact list, and swaps the lists at the end),
--   or nil at an upkeep tick: entries no longer scheduled leave the head (at most
--   trim_budget examined), and a pass starts when LLEN(backup) > 2 * ZCARD + slack;
--   else the next tick is upkeep_ms away ("-" with PX; 0: every call).
--   wrote: whether the call wrote anything before: if not, the pass's copy is its first
--   write, which a full server refuses (OOM); it is tried with pcall, and on OOM the
--   pass stays where it is until a later call.
--   Returns: nil, or an error reply to return (a refusal other than OOM).
--
-- Cost: O(trim_budget) at a tick, O(compact_step) per call during a pass.
-- include: variadic.lua
-- include: gather.lua
local function backup_upkeep(zset, backup, compact, cursor_key, cursor, wrote, trim_budget, compact_step, slack,
                             upkeep_ms)
    if cursor == "-" then
        return nil
    end
    if cursor then
        cursor = tonumber(cursor)
        local entries = redis.call("LRANGE", backup, cursor, cursor + compact_step - 1)
        if #entries > 0 then
            local scores = gather("ZMSCORE", zset, entries)
            local keep = {}
            for i = 1, #entries do
                if scores[i] then
                    keep[#keep + 1] = entries[i]
                end
            end
            if #keep > 0 and not wrote then
                local first = redis.pcall("RPUSH", compact, unpack(keep, 1, math.min(#keep, CHUNK)))
                if type(first) == "table" and first.err then
                    if not string.find(first.err, "OOM", 1, true) then
                        return redis.error_reply(first.err)
                    end
                    return nil -- server full: the pass resumes at the same cursor later
                end
                variadic("RPUSH", compact, { unpack(keep, CHUNK + 1) })
            else
                variadic("RPUSH", compact, keep)
            end
        end
        if cursor + #entries >= redis.call("LLEN", backup) then
            redis.call("UNLINK", backup)
            if redis.call("EXISTS", compact) == 1 then
                redis.call("RENAME", compact, backup)
            end
            redis.call("DEL", cursor_key)
        else
            redis.call("SET", cursor_key, cursor + #entries)
        end
        return nil
    end
    local head = redis.call("LINDEX", backup, 0)
    if head and not redis.call("ZSCORE", zset, head) then
        local heads = redis.call("LRANGE", backup, 0, trim_budget - 1)
        local scores = gather("ZMSCORE", zset, heads)
        local dead_prefix = 0
        while dead_prefix < #heads and not scores[dead_prefix + 1] do
            dead_prefix = dead_prefix + 1
        end
        redis.call("LTRIM", backup, dead_prefix, -1)
    end
    if redis.call("LLEN", backup) > 2 * redis.call("ZCARD", zset) + slack then
        redis.call("DEL", compact)
        redis.call("SET", cursor_key, 0)
    elseif upkeep_ms > 0 then
        -- On a full server this write may be refused: the next call ticks again.
        redis.pcall("SET", cursor_key, "-", "PX", upkeep_ms)
    end
    return nil
end
