-- decrement(flow, field, n): a count of the flow HASH down by n; a count never goes below
-- the truth: one that would is 0. Returns what the HINCRBY left.
local function decrement(flow, field, n)
    local left = redis.call("HINCRBY", flow, field, -n)
    if left < 0 then
        redis.call("HSET", flow, field, 0)
    end
    return left
end
