-- take_lib(): flow_take's helpers, made on its first call (other flow calls never define
-- them): leaves_ring, next_turn, end_turn, log_group_starts, more_waiting, take_clock (each
-- in its own file). They read and write the take's state `s` (see flow_take.lua).
local take_made = nil

local function take_lib()
    if take_made then
        return take_made
    end
    -- include: take_clock.lua
    -- include: leaves_ring.lua
    -- include: next_turn.lua
    -- include: end_turn.lua
    -- include: log_group_starts.lua
    -- include: more_waiting.lua
    take_made = {
        take_clock = take_clock,
        leaves_ring = leaves_ring,
        next_turn = next_turn,
        end_turn = end_turn,
        log_group_starts = log_group_starts,
        more_waiting = more_waiting,
    }
    return take_made
end
