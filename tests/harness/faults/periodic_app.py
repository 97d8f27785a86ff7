"""The worker app of the periodic scenarios: ``python -m dramatiq periodic_app:broker``.

``fault_app``'s broker, options and ``ready`` record, plus one actor, ``tick``, run by the
periodic schedules ``FAULTS_PERIODIC`` names (``"name=every_ms,..."``, default
``tick-a=1000``), all with the default ``catch_up="one"``. Each run records on the record
server (see ``fault_common``; kinds in ``periodic.py``):

* ``tick`` at its start: ``seq`` = the message's ``message_timestamp`` (the tick's time, the
  faulted server's epoch ms), ``attempt`` = its ``retries``, ``pid``, and ``extra`` =
  ``"<schedule>,<message id>,<faulted server's clock at the start, ms, or -1>,<run id>"``;
* ``tick-done`` at its end (same fields).

The faulted server's clock is read with a client of its own that never retries and gives up
after 250 ms (the server may be down): -1 then. Both servers run on this host, so the two
clocks are one; the faulted one is what the broker compares due times with.
"""

from __future__ import annotations

import itertools
import os
import time
from typing import Any

import dramatiq
import redis
from dramatiq.middleware import CurrentMessage
from fault_app import QUEUE, WORK_S, broker, stamp  # noqa: F401 - broker: the CLI's target
from redis.backoff import NoBackoff
from redis.retry import Retry

from dramatiq_redisson import periodic

TICK = "tick"
TICK_DONE = "tick-done"

#: name -> every (ms)
SCHEDULES = {
    name: int(every)
    for name, every in (item.split("=") for item in os.environ.get("FAULTS_PERIODIC", "tick-a=1000").split(","))
}

_clock: redis.Redis | None = None
_run_ids = itertools.count()


def faulted_now_ms() -> int:
    """The faulted server's clock (epoch ms), or -1 when it does not answer within 250 ms."""
    global _clock
    try:
        if _clock is None:
            _clock = redis.Redis.from_url(
                os.environ["FAULTS_BROKER_URL"],
                socket_timeout=0.25,
                socket_connect_timeout=0.25,
                retry=Retry(NoBackoff(), 0),
            )
        seconds, micros = _clock.time()
        return int(seconds) * 1000 + int(micros) // 1000
    except (redis.RedisError, OSError):
        _clock = None
        return -1


@dramatiq.actor(queue_name=QUEUE, max_retries=0)
def tick(name: str) -> None:
    """One run of a tick: ``tick``, a little work, ``tick-done``."""
    message: Any = CurrentMessage.get_current_message()
    pid = os.getpid()
    run_id = f"{pid}.{next(_run_ids)}"
    at = message.message_timestamp
    attempt = int(message.options.get("retries", 0))
    fields = f"{message.options.get('periodic', name)},{message.message_id}"
    stamp()(TICK, at, attempt, pid, f"{fields},{faulted_now_ms()},{run_id}")
    time.sleep(WORK_S)
    stamp()(TICK_DONE, at, attempt, pid, f"{fields},-1,{run_id}")


for _name, _every_ms in SCHEDULES.items():
    periodic(every=f"{_every_ms}ms", name=_name, args=(_name,))(tick)
