"""The app of the rolling-upgrade test (``test_rolling_upgrade.py``), run by both releases
the test puts side by side:

- ``python -m dramatiq tests.upgrade.upgrade_app:broker`` is a worker command;
- ``python -m tests.upgrade.upgrade_app`` is a producer, which sends until told to stop.

Its actor ``job`` is in every process; ``fresh`` only in this tree's (``UPGRADE_RELEASE=new``),
as an actor a new release adds.

It uses nothing of ``dramatiq_redisson`` but ``RedissonBroker(url=...)``, which every
release has: the previous release's workers import this module from the tree under test,
with that release's package first on ``PYTHONPATH``.

Environment: ``UPGRADE_URL`` the server (the broker's and the records'); ``UPGRADE_RELEASE``
the label written in every record (``old`` or ``new``).

Records, lists of JSON on the server (``*_ms`` on the server's clock; the key names are in
``tests/upgrade/__init__.py``):

- :data:`PROCS`: ``{"event": "ready" | "stopped", "pid", "ppid", "release", "package"}``,
  when a worker process has booted and when it has shut down (``package``: the file its
  ``dramatiq_redisson`` came from);
- :data:`SENT`: ``{"id", "by", "delay_ms", "hold_ms", "sent_ms"}`` (``sent_ms`` is read just
  before the send: a delayed message is due no earlier than ``sent_ms + delay_ms``);
- :data:`RUNS`: ``{"id", "event": "start" | "finish", "pid", "release", "at_ms"}``.

The producer sends one message every :data:`INTERVAL_S`, alternately ready and delayed by
1-3 s, and the bursts the test pushes on ``upgrade:burst:<release>`` (JSON ``{"count",
"delay_ms", "hold_ms"}``; ``delay_ms`` -1 spreads the delays over 1-3 s).
"""

from __future__ import annotations

import itertools
import json
import os
import time
from typing import Any

import dramatiq
import redis
from dramatiq.middleware import Middleware

import dramatiq_redisson
from dramatiq_redisson import RedissonBroker
from tests.upgrade import PROCS, QUEUE, RUNS, SENT, STOP_PRODUCING, burst_key

#: The producers' background pace (s between two sends) and how long a background message's run takes (ms).
INTERVAL_S, SHORT_MS = 0.1, 20
RELEASE = os.environ.get("UPGRADE_RELEASE", "new")

broker = RedissonBroker(url=os.environ["UPGRADE_URL"])
dramatiq.set_broker(broker)
records = redis.Redis.from_url(os.environ["UPGRADE_URL"])


def server_ms() -> int:
    seconds, micros = records.time()
    return int(seconds) * 1000 + int(micros) // 1000


def note(key: str, **fields: Any) -> None:
    records.rpush(key, json.dumps({"pid": os.getpid(), "release": RELEASE, **fields}))


class Lifecycle(Middleware):
    """Records when a worker process is ready and when it has stopped, and which package it runs."""

    def after_worker_boot(self, broker: dramatiq.Broker, worker: dramatiq.Worker) -> None:
        self._note("ready")

    def after_worker_shutdown(self, broker: dramatiq.Broker, worker: dramatiq.Worker) -> None:
        self._note("stopped")

    def _note(self, event: str) -> None:
        note(PROCS, event=event, ppid=os.getppid(), package=os.path.realpath(dramatiq_redisson.__file__))


broker.add_middleware(Lifecycle())


@dramatiq.actor(queue_name=QUEUE, max_retries=0)
def job(message_id: str, hold_ms: int) -> None:
    """One run: ``start``, ``hold_ms`` of sleep, ``finish``. No retries: a failure is a dead letter."""
    note(RUNS, id=message_id, event="start", at_ms=server_ms())
    time.sleep(hold_ms / 1000)
    note(RUNS, id=message_id, event="finish", at_ms=server_ms())


if RELEASE == "new":
    # An actor that this tree adds (as a new release would): the previous release's
    # workers do not declare it.
    @dramatiq.actor(queue_name=QUEUE, max_retries=0)
    def fresh(message_id: str) -> None:
        note(RUNS, id=message_id, event="start", at_ms=server_ms())
        note(RUNS, id=message_id, event="finish", at_ms=server_ms())


def send(message_id: str, delay_ms: int, hold_ms: int) -> None:
    note(SENT, id=message_id, by=RELEASE, delay_ms=delay_ms, hold_ms=hold_ms, sent_ms=server_ms())
    job.send_with_options(args=(message_id, hold_ms), delay=delay_ms or None)


def spread_delay(n: int) -> int:
    """A delay of 1-3 s for the ``n``-th message (spread, repeatable)."""
    return 1000 + (n * 397) % 2001


def produce() -> None:
    numbers = itertools.count()
    while not records.exists(STOP_PRODUCING):
        n = next(numbers)
        send(f"{RELEASE}-{n}", spread_delay(n) if n % 2 else 0, SHORT_MS)
        while (burst := records.lpop(burst_key(RELEASE))) is not None:
            spec = json.loads(burst)
            for _ in range(spec["count"]):
                n = next(numbers)
                delay = spread_delay(n) if spec["delay_ms"] < 0 else spec["delay_ms"]
                send(f"{RELEASE}-{n}", delay, spec["hold_ms"])
        time.sleep(INTERVAL_S)


if __name__ == "__main__":
    produce()
