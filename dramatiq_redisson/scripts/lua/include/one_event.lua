-- one_event(kind): one event of kind (1 processed, 2 failed, 3 retried) as counts
-- {processed, failed, retried}.
local function one_event(kind)
    return { kind == 1 and 1 or 0, kind == 2 and 1 or 0, kind == 3 and 1 or 0 }
end
