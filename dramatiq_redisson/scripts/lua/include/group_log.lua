-- group_log(ctx, group): the rate log (LIST of start times) of a group.
local function group_log(ctx, group)
    return ctx.rate_prefix .. "g" .. group .. "}"
end
