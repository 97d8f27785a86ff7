-- probe: try, without changing anything, every command the broker's scripts issue, on
-- one queue's real key names; report the calls the user's ACL denies.
--
-- KEYS none. The key names travel in ARGV on purpose: EVALSHA checks its declared
--          KEYS against the user's key patterns before the script runs, so one denied
--          key would fail the whole probe with a bare "No permissions to access a key";
--          called from inside, every denial is reported with the key it concerns.
-- ARGV[1]  token  a hash field / set member / zset member that no real entry uses
-- ARGV[2]  scratch  a key of the queue's namespace the broker never uses; commands that
--          would create or delete something run on it, and it is removed again
-- ARGV[3]  channel  the queue's channel (PUBLISH "0": idle consumers fetch once, nothing else)
-- ARGV[4..] checks  pairs: type ("list", "hash", "set", "zset", "string" or "none"), key name
--
-- Every call below is a no-op on real keys: reads, writes of the token that does not
-- exist (HDEL, SREM, ZREM, ZADD XX), ZPOPMAX of 0 entries, ZREMRANGEBYSCORE of an empty
-- range (min 1 > max 0), LTRIM 0 -1, LPOP with count 0, RENAME of a key to itself, and
-- invalid forms that fail after the ACL check (HSET with an odd field list, SET with NX
-- and XX). Errors other than ACL denials (OOM, WRONGTYPE, "no such key", syntax) mean the
-- call was allowed and are ignored.
--
-- Returns {denied, unchecked}: denied is a flat list of command, target, error text per
-- denied call; unchecked lists commands not tried because nothing could undo them (the
-- user may run neither DEL, UNLINK nor the command that removes the element again).

local token, scratch, channel = ARGV[1], ARGV[2], ARGV[3]
local denied, unchecked = {}, {}

-- An ACL refusal, as Redis 7+ and Valkey word it inside scripts ("ACL failure in
-- script: ...", or NOPERM) and as Redis 6.2 does ("The user executing the script can't ...").
local function refusal(e)
    return string.find(e, "ACL failure", 1, true)
        or string.find(e, "NOPERM", 1, true)
        or string.find(e, "The user executing the script can't", 1, true)
end

local function check(command, target, ...)
    local reply = redis.pcall(command, ...)
    if type(reply) == "table" and reply.err then
        local e = reply.err
        if refusal(e) then
            denied[#denied + 1] = string.lower(command)
            denied[#denied + 1] = target
            denied[#denied + 1] = e
            return false
        end
    end
    return true
end

local read = {
    list = function(k)
        check("LLEN", k, k)
        check("LINDEX", k, k, 0)
        check("LRANGE", k, k, 1, 0)
    end,
    hash = function(k)
        check("HLEN", k, k)
        check("HEXISTS", k, k, token)
        check("HGET", k, k, token)
        check("HMGET", k, k, token)
        check("HGETALL", scratch, scratch) -- the command, on the scratch key (a real hash may be large)
        check("HKEYS", scratch, scratch)
    end,
    set = function(k)
        check("SMEMBERS", k, k)
    end,
    zset = function(k)
        check("ZCARD", k, k)
        check("ZCOUNT", k, k, 1, 0)
        check("ZSCORE", k, k, token)
        check("ZMSCORE", k, k, token)
        check("ZRANK", k, k, token)
        check("ZRANGE", k, k, 1, 0)
        check("ZRANGEBYSCORE", k, k, 1, 0)
    end,
    string = function(k)
        check("GET", k, k)
        check("MGET", k, k)
        check("EXISTS", k, k)
    end,
    none = function(k)
        check("EXISTS", k, k)
    end,
}

local write = {
    list = function(k)
        check("LTRIM", k, k, 0, -1)
        check("LPOP", k, k, 0)
        check("RENAME", k, k, k)
    end,
    hash = function(k)
        check("HDEL", k, k, token)
        check("HSET", k, k, token, "", token)
    end,
    set = function(k)
        check("SREM", k, k, token)
    end,
    zset = function(k)
        check("ZREM", k, k, token)
        check("ZADD", k, k, "XX", 0, token)
        check("ZPOPMAX", k, k, 0) -- pops nothing
        check("ZREMRANGEBYSCORE", k, k, 1, 0)
    end,
    string = function(k)
        check("SET", k, k, token, "NX", "XX")
        check("RENAME", k, k, k)
        check("BITFIELD", k, k, "GET", "u8", 0) -- only reads; creates no key
    end,
    none = function(k)
        check("ZREM", k, k, token)
    end,
}

check("TIME", "")
check("PUBLISH", channel, channel, "0")

for i = 4, #ARGV, 2 do
    local kind, key = ARGV[i], ARGV[i + 1]
    read[kind](key)
    write[kind](key)
end

-- The scratch key: first the calls that change nothing on a missing key, then the
-- ones that create it, each undone at once by whatever removal the user may run.
local del = check("DEL", scratch, scratch)
local unlink = check("UNLINK", scratch, scratch)
local ltrim = check("LTRIM", scratch, scratch, 0, -1)
local srem = check("SREM", scratch, scratch, token)
local hdel = check("HDEL", scratch, scratch, token)
check("LREM", scratch, scratch, 0, token)
check("PEXPIRE", scratch, scratch, 60000)

local function remove(fallback, ...)
    if del then
        redis.pcall("DEL", scratch)
    elseif unlink then
        redis.pcall("UNLINK", scratch)
    else
        redis.pcall(fallback, scratch, ...)
    end
end

if del or unlink or ltrim then
    check("LPUSH", scratch, scratch, token)
    remove("LTRIM", 1, 0)
    check("RPUSH", scratch, scratch, token)
    remove("LTRIM", 1, 0)
else
    unchecked[#unchecked + 1] = "lpush"
    unchecked[#unchecked + 1] = "rpush"
end

if del or unlink or srem then
    check("SADD", scratch, scratch, token)
    remove("SREM", token)
else
    unchecked[#unchecked + 1] = "sadd"
end

if del or unlink or hdel then
    check("HSETNX", scratch, scratch, token, "")
    remove("HDEL", token)
    check("HINCRBY", scratch, scratch, token, 0)
    remove("HDEL", token)
else
    unchecked[#unchecked + 1] = "hsetnx"
    unchecked[#unchecked + 1] = "hincrby"
end

return { denied, unchecked }
