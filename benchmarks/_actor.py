"""The benchmark actor: records (seq, server TIME, pid) in Redis when it starts."""

from __future__ import annotations

import os
from typing import Any

import dramatiq

from ._common import QUEUE, REC_KEY

#: One round trip: the start time is the server's clock (TIME), the same clock that
#: offer.lua uses to compute due times, so start − due needs no clock translation.
#: Sent with EVAL (not EVALSHA) so that INFO commandstats keeps its cost (cmdstat_eval)
#: apart from the brokers' scripts (cmdstat_evalsha).
RECORD_LUA = """
local t = redis.call("TIME")
redis.call("RPUSH", KEYS[1], ARGV[1] .. " " .. t[1] .. " " .. t[2] .. " " .. ARGV[2])
return 1
"""


def declare(broker: Any) -> Any:
    """Declare the ``bench_record`` actor on ``broker`` and return it."""
    client = broker.client

    def bench_record(seq: int) -> None:
        client.eval(RECORD_LUA, 1, REC_KEY, seq, os.getpid())

    decorate: Any = dramatiq.actor
    return decorate(bench_record, broker=broker, queue_name=QUEUE, actor_name="bench_record", max_retries=0)
