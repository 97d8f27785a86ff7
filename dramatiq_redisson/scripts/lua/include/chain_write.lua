-- chain_write(c, step): the writes of one chain_step (chain_step.lua has the scheme and
-- c's fields), after the caller's first write.
-- include: key_at.lua
local function chain_write(c, step)
    local name, at = step.name, step.at
    if step.current then
        redis.call("HSET", c.state, name .. "|u", step.current)
        return
    end
    if not step.run then
        redis.call("HDEL", c.chains, name)
        redis.call("HSET", c.state, name .. "|s", string.format("%d", step.tick))
        return
    end
    if step.skip then
        redis.call("HINCRBY", c.state, name .. "|k", 1)
    else
        redis.call("HSET", c.state, name .. "|r", string.format("%d", step.tick), name .. "|l", c.now_ms - step.due_ms)
        redis.call("HINCRBY", c.state, name .. "|n", 1)
        if step.overlap then
            redis.call("HSET", c.state, name .. "|u", step.member)
        end
    end
    if step.last then
        redis.call("HDEL", c.chains, name)
        redis.call("HSET", c.state, name .. "|e", "limit")
        return
    end
    if not at then
        redis.call("HDEL", c.chains, name)
        redis.call("HSET", c.state, name .. "|s", string.format("%d", step.tick + 1))
        return
    end
    local message_id = "periodic:" .. name .. ":" .. at
    local next_member = key_at(tonumber(at)) .. message_id
    redis.call("ZADD", c.zset, string.format("%d", step.due), next_member)
    redis.call("RPUSH", c.backup, next_member)
    -- The same payload, the new time as its timestamp (the last field: see ready_body.lua).
    redis.call("HSET", c.payloads, message_id, key_at(tonumber(at)) .. string.match(step.body, "^(.*\30)") .. at)
    redis.call("HSET", c.chains, name, next_member)
    redis.call("HSET", c.state, name .. "|t", step.rest)
end
