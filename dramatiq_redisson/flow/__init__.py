"""Flow control: priorities, group lanes, and the user's per-queue limits (``broker.limits``)."""
