"""The worker app of the fault suite: ``python -m dramatiq fault_app:broker``.

Configured by environment variables (set by ``procs.subprocess_env``):

* ``FAULTS_BROKER_URL``: the faulted server (the one the suite breaks);
* ``FAULTS_RECORD_URL``, ``FAULTS_PREFIX``: where and under which prefix runs are recorded;
* ``FAULTS_QUEUE``: the queue name;
* ``FAULTS_BROKER``: ``redisson`` (default) or ``builtin`` (Dramatiq's RedisBroker);
* ``FAULTS_WORK_MS``: how long each run works (so that a killed worker has messages in
  flight);
* ``FAULTS_HEARTBEAT_TIMEOUT``, ``FAULTS_MAINTENANCE_INTERVAL``: broker options (ms). A
  worker killed with SIGKILL leaves its fetched messages in its ack set until another
  worker's maintenance finds its heartbeat older than the timeout; with Dramatiq's
  defaults (60 s, and maintenance every 30 s) that alone would outlast a run.

Every run records ``start`` and then ``finish`` or ``fail`` on the record server, so a
run that started and never ended (its process was killed) is visible in the analysis.
"""

from __future__ import annotations

import itertools
import os
import time
from typing import Any

import dramatiq
from dramatiq.brokers.redis import RedisBroker
from dramatiq.middleware import CurrentMessage, Middleware
from fault_common import FAIL, FINISH, READY, START, Stamper

import dramatiq_redisson
from dramatiq_redisson import RedissonBroker

QUEUE = os.environ.get("FAULTS_QUEUE", "faults")
WORK_S = int(os.environ.get("FAULTS_WORK_MS", "10")) / 1000
#: Delay (ms) of the retry of a fail-once message: exact, unlike min/max_backoff, which
#: Dramatiq jitters down to half.
RETRY_DELAY_MS = 1000

BUILTIN = os.environ.get("FAULTS_BROKER", "redisson") == "builtin"
#: Flow control on (``FAULTS_FLOW=1``): messages in groups and at priorities, under a queue
#: and a group concurrency limit and a group rate (40 starts a second per group: above the
#: offered rate per group, under the bursts that follow a fault).
FLOW = os.environ.get("FAULTS_FLOW") == "1"
FLOW_MAX_PRIORITY = 3
FLOW_GROUPS = 8
FLOW_LIMITS = {"concurrency": 6, "group_concurrency": 1, "group_rate": 40, "per_ms": 1000}
broker: dramatiq.Broker
if BUILTIN:
    # Dramatiq's RedisBroker side by side, with the same heartbeat timeout (its
    # maintenance runs by chance on fetches: no interval to set).
    broker = RedisBroker(
        url=os.environ["FAULTS_BROKER_URL"],
        heartbeat_timeout=int(os.environ.get("FAULTS_HEARTBEAT_TIMEOUT", "15000")),
    )
else:
    broker = RedissonBroker(
        url=os.environ["FAULTS_BROKER_URL"],
        heartbeat_timeout=int(os.environ.get("FAULTS_HEARTBEAT_TIMEOUT", "15000")),
        maintenance_interval=int(os.environ.get("FAULTS_MAINTENANCE_INTERVAL", "5000")),
        # FLOW: priorities 0..FLOW_MAX_PRIORITY (the producer sends groups, priorities
        # and sets limits: see fault_producer)
        **({"max_priority": FLOW_MAX_PRIORITY} if FLOW else {}),
    )
broker.add_middleware(CurrentMessage())
dramatiq.set_broker(broker)

_stamp: Stamper | None = None
_run_ids = itertools.count()


def stamp() -> Stamper:
    """The record-server stamper, created lazily: the producer imports this module too,
    and the dramatiq CLI imports it before forking nothing, but be safe across forks."""
    global _stamp
    if _stamp is None:
        _stamp = Stamper(os.environ["FAULTS_RECORD_URL"], os.environ["FAULTS_PREFIX"])
    return _stamp


class ReadySignal(Middleware):
    """Records ``ready`` once a worker process's consumers and threads run."""

    def after_worker_boot(self, broker: dramatiq.Broker, worker: dramatiq.Worker) -> None:
        where = os.path.dirname(os.path.abspath(dramatiq_redisson.__file__))
        if BUILTIN:
            where = f"built-in RedisBroker (dramatiq {dramatiq.__version__})"
        stamp()(READY, pid=os.getpid(), extra=where)


broker.add_middleware(ReadySignal())


@dramatiq.actor(queue_name=QUEUE, max_retries=1)
def work(seq: int, fail_once: bool) -> None:
    """One run: ``start``, a little work, then ``fail`` + Retry(1 s) on the first attempt
    of a fail-once message, else ``finish``."""
    message: Any = CurrentMessage.get_current_message()
    attempt = int(message.options.get("retries", 0)) if message is not None else 0
    run_id = f"{os.getpid()}.{next(_run_ids)}"
    pid = os.getpid()
    stamp()(START, seq, attempt, pid, run_id)
    time.sleep(WORK_S)
    if fail_once and attempt == 0:
        stamp()(FAIL, seq, attempt, pid, run_id)
        raise dramatiq.Retry(delay=RETRY_DELAY_MS)
    stamp()(FINISH, seq, attempt, pid, run_id)
