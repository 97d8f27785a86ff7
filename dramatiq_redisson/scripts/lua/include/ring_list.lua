-- ring_list(ctx, priority): the ring (LIST of lane ids, taken in turn) of a priority.
local function ring_list(ctx, priority)
    return ctx.ring_prefix .. priority .. "}"
end
