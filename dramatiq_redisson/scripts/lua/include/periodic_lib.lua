-- periodic_lib(): periodic chaining's functions (chain_step.lua, chain_write.lua), made on
-- the first due periodic tick of a transfer call and kept for the rest of it: a call that
-- moves no tick does not define them (issue 55: what a call costs before its first command).
-- Its fields: step = chain_step, write = chain_write.
local periodic_lib_made = nil

local function periodic_lib()
    if periodic_lib_made then
        return periodic_lib_made
    end
    -- include: chain_step.lua
    -- include: chain_write.lua
    periodic_lib_made = { step = chain_step, write = chain_write }
    return periodic_lib_made
end
