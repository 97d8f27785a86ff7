"""Fixed bounds and intervals of the delivery path: the backup-list upkeep each transfer call
does (none grows with the backlog), how often a process writes its heartbeat, and the
periodic chains' grace and horizon."""

#: How often (ms) a consumer's transfers tidy the backup list and the dedupe window's moved
#: members (an upkeep tick), instead of on every call: a transfer that moves one message
#: then runs 6 commands fewer. The tick's trim budget keeps up with 10 000 moves/s; past
#: that, compaction bounds the list.
UPKEEP_INTERVAL_MS = 100

#: Dead entries popped from the head of the backup list per upkeep tick.
TRIM_BUDGET = 1000

#: Backup-list entries a compaction pass examines per transfer call.
COMPACT_STEP = 400

#: A compaction pass starts when the backup list exceeds 2 × scheduled + this many entries.
COMPACT_SLACK = 1024

#: How often (ms) a process writes its heartbeat (Dramatiq's ``__heartbeats__``) from its
#: fetches and acks, at most: not on every call (three commands fewer per fetch, two per
#: ack). A shorter ``heartbeat_timeout`` shortens it to a tenth of that.
HEARTBEAT_INTERVAL_MS = 1000

#: A periodic tick that moves more than this many ms after its time counts as missed: the
#: schedule's catch-up policy decides whether it runs (see ``periodic._schedules``).
PERIODIC_GRACE_MS = 1000

#: Tick times a schedule keeps computed ahead of its chained tick (transfer.lua chains
#: the next one from them; cron needs the time zone database, so the client computes them).
PERIODIC_HORIZON = 64

#: A schedule with fewer upcoming times than this is topped up to the horizon.
PERIODIC_LOW_WATER = 16
