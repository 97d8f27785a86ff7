"""Bounds on the backup-list upkeep each transfer call does; none grows with the backlog."""

#: Dead entries popped from the head of the backup list per transfer call.
TRIM_BUDGET = 200

#: Backup-list entries a compaction pass examines per transfer call.
COMPACT_STEP = 400

#: A compaction pass starts when the backup list exceeds 2 × scheduled + this many entries.
COMPACT_SLACK = 1024
