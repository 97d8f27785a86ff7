"""The failover harness shared by ``tests/connection/test_sentinel.py`` and ``tests/connection/test_cluster.py``.

One run: a Worker (in-process threads) and a producer, each on a broker of its own, run
against a topology from ``tests/harness/topology.py`` while a fault thread breaks it mid-run
(kill -9 the primary, SIGSTOP it, migrate the queue's slot...). A tenth of the messages
fail once and retry with a delay; four fifths are delayed 1-3 s. Every send and run is
recorded on a server the fault never touches (the session's server) and counted with the
fault suite's analysis (``tests/harness/faults/analysis.py``: lost, duplicated, early, lateness).
"""

from __future__ import annotations

import collections
import logging
import os
import random
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import dramatiq
from dramatiq import Worker
from dramatiq.middleware import CurrentMessage, default_middleware

from dramatiq_redisson import RedissonBroker

from .faults.analysis import Stats, analyse
from .faults.fault_common import FAIL, FINISH, REFUSED, SENT, START, Record, Stamper, records_key
from .faults.scenarios import Event
from .topology import wait_for

QUEUE = "failover"
DELAY_MIN_MS, DELAY_MAX_MS = 1000, 3000


@dataclass(frozen=True)
class Size:
    messages: int
    rate: float
    fault_after_s: float
    threads: int


SIZES = {
    "small": Size(messages=400, rate=50, fault_after_s=3.0, threads=4),
    "full": Size(messages=3000, rate=200, fault_after_s=5.0, threads=8),
}


@dataclass
class Fault:
    """What a fault function reports (server times from the record server, epoch ms)."""

    #: When the fault began.
    at_ms: int = 0
    #: When the topology served the queue again (promotion, migration done).
    recovered_ms: int = 0
    #: Seconds from the fault to that, as the topology measured it.
    recovery_s: float = 0.0
    #: How far back before ``at_ms`` acknowledged writes may be lost (asynchronous
    #: replication): runs in that window explain a duplicate.
    loss_ms: int = 0
    #: Set by the fault function when it has completely finished (the topology is whole).
    done_ms: int = 0
    #: Each promotion the topology announced during the run (record clock), when it
    #: watches them: a failover after the injected one (sentinels that took a primary
    #: slowed by the loaded machine for down) may lose acks of its own.
    switches_ms: list[int] = field(default_factory=list)
    #: How long before a later switch the primary may have been taken for down, and so
    #: how far back its acks may be lost.
    switch_window_ms: int = 0
    #: When a primary a later switch demoted reported itself a replica again (record
    #: clock): until then it may have taken writes as a second primary (split brain)
    #: that its conversion discards.
    demoted_ms: list[int] = field(default_factory=list)
    #: What the fault function and the topology's watcher saw, (record ms, what): shown
    #: with a failed check (``FailoverResult.row``).
    timeline: list[tuple[int, str]] = field(default_factory=list)


@dataclass
class FailoverResult:
    label: str
    wait_for_replicas: int
    stats: Stats
    fault: Fault
    #: From the fault until the first run of a delayed message after it (ms, record clock).
    delayed_flow_ms: int | None
    #: From the fault until the first send after it that returned (ms).
    sends_flow_ms: int | None
    refused_by: dict[str, int] = field(default_factory=dict)
    #: Dramatiq's "Consumer encountered a connection error" restarts (the consumer
    #: should back off on its own instead).
    consumer_restarts: int = 0
    #: The consumer is subscribed to the queue's channel where the queue now lives.
    resubscribed: bool = False
    #: When it is not: where the consumer's pub/sub connection is, and what the topology
    #: says (each server's role and subscriber count), so a CI log tells which side erred.
    subscription_detail: str = ""
    #: For each unexplained duplicate (the first few): its send and runs, in ms from the
    #: fault, so a CI log tells which path ran it again.
    dup_detail: list[str] = field(default_factory=list)

    def timeline(self) -> list[str]:
        """The fault's timeline, ms from the fault."""
        return [f"+{at - self.fault.at_ms} {what}" for at, what in sorted(self.fault.timeline)][:80]

    def row(self) -> dict[str, Any]:
        s = self.stats
        return {
            "fault": self.label,
            "wait_for_replicas": self.wait_for_replicas,
            "sent": s.sent,
            "accepted": s.sent - s.refused,
            "refused": s.refused,
            "refused_by": self.refused_by,
            "refused_ran": s.refused_ran,
            "lost": s.lost,
            "lost_seqs": s.lost_seqs[:20],
            "dup_explained": s.dup_explained,
            "dup_unexplained": s.dup_unexplained,
            "early": s.early,
            "late_p50_ms": s.late_p50,
            "late_p99_ms": s.late_p99,
            "late_max_ms": s.late_max,
            "recovery_s": round(self.fault.recovery_s, 2),
            "delayed_flow_ms": self.delayed_flow_ms,
            "sends_flow_ms": self.sends_flow_ms,
            "consumer_restarts": self.consumer_restarts,
            "resubscribed": self.resubscribed,
            "switches_ms": [t - self.fault.at_ms for t in self.fault.switches_ms],
            **({"subscription_detail": self.subscription_detail} if self.subscription_detail else {}),
            **({"dup_detail": self.dup_detail} if self.dup_detail else {}),
            **({"timeline": self.timeline()} if self.dup_detail or self.subscription_detail else {}),
        }


class _RestartCounter(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        if "Consumer encountered" in record.getMessage():
            self.count += 1


class _SubscriptionLog(logging.Handler):
    """The broker's log lines about subscriptions and the lease (DEBUG included), the
    last ``keep`` of them with their times, for :attr:`FailoverResult.subscription_detail`."""

    WORDS = ("subscri", "lease", "Subscribed")

    def __init__(self, keep: int = 30) -> None:
        super().__init__(logging.DEBUG)
        self.lines: collections.deque[str] = collections.deque(maxlen=keep)

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        if any(word in text for word in self.WORDS):
            stamp = time.strftime("%H:%M:%S", time.localtime(record.created)) + f".{int(record.msecs):03d}"
            self.lines.append(f"{stamp} {record.levelname} {text}")


def epoch_ms(reply: tuple[int, int]) -> int:
    seconds, micros = reply
    return int(seconds) * 1000 + int(micros) // 1000


def run_failover(
    records_url: str,
    *,
    label: str,
    size: Size,
    wait_for_replicas: int,
    make_client: Callable[[], Any],
    fault: Callable[[RedissonBroker, Callable[[], int], Fault], None],
    subscribed: Callable[[RedissonBroker], bool],
    describe: Callable[[RedissonBroker], str] | None = None,
) -> FailoverResult:
    """One run on clients from ``make_client``; ``fault(broker, now_ms, report)`` runs in a
    thread ``size.fault_after_s`` after the first send and fills ``report`` (``now_ms``
    reads the record server's clock); ``subscribed(broker)`` tells, after the run,
    whether the consumer listens where the queue now lives (when not, ``describe(broker)``
    says what the topology sees)."""
    prefix = f"{label}:{wait_for_replicas}:{uuid.uuid4().hex[:8]}"
    stamp = Stamper(records_url, prefix)
    rng = random.Random(7)

    def now_ms() -> int:
        return epoch_ms(stamp.client.time())

    broker = RedissonBroker(
        client=make_client(),
        middleware=[m() for m in default_middleware],
        wait_for_replicas=wait_for_replicas,
        wait_timeout=1000,
        heartbeat_timeout=15_000,
        maintenance_interval=5000,
    )
    broker.add_middleware(CurrentMessage())
    producer_broker = RedissonBroker(client=make_client(), wait_for_replicas=wait_for_replicas)

    @dramatiq.actor(broker=broker, queue_name=QUEUE, max_retries=1)
    def work(seq: int, fail_once: bool) -> None:
        message = CurrentMessage.get_current_message()
        attempt = int(message.options.get("retries", 0)) if message is not None else 0
        run_id = f"{threading.get_ident()}.{uuid.uuid4().hex[:8]}"
        stamp(START, seq, attempt, os.getpid(), run_id)
        if fail_once and attempt == 0:
            stamp(FAIL, seq, attempt, os.getpid(), run_id)
            raise dramatiq.Retry(delay=1000)
        stamp(FINISH, seq, attempt, os.getpid(), run_id)

    def send(seq: int, delay: int, fail_once: bool) -> None:
        message = work.message_with_options(args=(seq, fail_once))
        stamp(SENT, seq, 0, os.getpid(), f"{delay},{int(fail_once)}")
        try:
            producer_broker.enqueue(message, delay=delay or None)
        except Exception as e:  # noqa: BLE001 - a refused send is counted, not lost
            stamp(REFUSED, seq, 0, os.getpid(), type(e).__name__)

    restarts = _RestartCounter()
    logging.getLogger("dramatiq").addHandler(restarts)
    # The broker's DEBUG lines about its subscriptions, kept for a failure's detail.
    ours = logging.getLogger("dramatiq_redisson")
    subscription_log, level = _SubscriptionLog(), ours.level
    ours.addHandler(subscription_log)
    ours.setLevel(logging.DEBUG)
    worker = Worker(broker, worker_timeout=100, worker_threads=size.threads)
    worker.start()
    report = Fault()
    failure: list[BaseException] = []

    def run_fault() -> None:
        time.sleep(size.fault_after_s)
        try:
            fault(broker, now_ms, report)
        except BaseException as e:  # noqa: BLE001 - re-raised by the test thread
            failure.append(e)

    fault_thread = threading.Thread(target=run_fault, daemon=True)
    key = records_key(prefix)
    try:
        fault_thread.start()
        began = time.monotonic()
        for seq in range(size.messages):
            pause = began + seq / size.rate - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            delay = 0 if rng.random() < 0.2 else rng.randint(DELAY_MIN_MS, DELAY_MAX_MS)
            send(seq, delay, rng.random() < 0.1)
        fault_thread.join(timeout=90)
        if failure:
            raise failure[0]
        assert report.done_ms, f"the fault did not complete: {report}"

        def done() -> bool:
            recs = [Record.parse(r) for r in stamp.client.lrange(key, 0, -1)]
            sent = {r.seq for r in recs if r.kind == SENT}
            settled = {r.seq for r in recs if r.kind in (FINISH, REFUSED)}
            return sent <= settled

        wait_for(done, timeout=DELAY_MAX_MS / 1000 + 20, interval=0.2)
        time.sleep(1.0)  # a late duplicate shows up
        resubscribed = wait_for(lambda: subscribed(broker), timeout=5, interval=0.1)
        detail = ""
        if not resubscribed:
            detail = _pubsub_addresses(worker) + (f"; {describe(broker)}" if describe else "")
            detail += "; the broker's log: " + " | ".join(subscription_log.lines)
    finally:
        worker.stop()
        logging.getLogger("dramatiq").removeHandler(restarts)
        ours.removeHandler(subscription_log)
        ours.setLevel(level)
        broker.close()
        producer_broker.close()
    records = [Record.parse(r) for r in stamp.client.lrange(key, 0, -1)]
    stamp.client.delete(key)
    stamp.close()
    stats = analyse(records, fault_events(label, report, records))
    sent_delay = {r.seq: int(r.extra.split(",")[0]) for r in records if r.kind == SENT}
    after = [r for r in records if r.ms >= report.at_ms]
    delayed_runs = [r.ms for r in after if r.kind == START and (sent_delay.get(r.seq) or r.attempt > 0)]
    refused_seqs = {r.seq for r in records if r.kind == REFUSED}
    sent_ms = {r.seq: r.ms for r in records if r.kind == SENT}
    # The first send that returned after sends had started to fail (a send stamped a moment
    # before the fault may still have got through).
    first_refused = min((sent_ms[s] for s in refused_seqs if sent_ms[s] >= report.at_ms), default=report.at_ms)
    accepted_after = [sent_ms[s] for s in sent_ms if s not in refused_seqs and sent_ms[s] > first_refused]
    refused_by: dict[str, int] = {}
    for r in records:
        if r.kind == REFUSED:
            refused_by[r.extra] = refused_by.get(r.extra, 0) + 1
    return FailoverResult(
        label=label,
        wait_for_replicas=wait_for_replicas,
        stats=stats,
        fault=report,
        delayed_flow_ms=min(delayed_runs) - report.at_ms if delayed_runs else None,
        sends_flow_ms=min(accepted_after) - report.at_ms if accepted_after else None,
        refused_by=refused_by,
        consumer_restarts=restarts.count,
        resubscribed=resubscribed,
        subscription_detail=detail,
        dup_detail=_dup_detail(records, stats.dup_unexplained_seqs[:10], report),
    )


def fault_events(label: str, report: Fault, records: list[Record]) -> list[Event]:
    """The windows in which a run explains a later duplicate: the injected fault's, and
    each later switch's the topology announced (see :class:`Fault`)."""
    events = [Event(label, report.at_ms, report.recovered_ms, loss_ms=report.loss_ms)]
    # A promotion after the injected one (its first switch is that one's) is a failover
    # of its own, of a primary that was alive: until the demoted one reports itself a
    # replica it may still take writes (acks) that its conversion then discards, so runs
    # from a little before that switch until then explain a duplicate too. (One
    # sentinel's account of the conversion: it may hear of it a moment late, hence the
    # loss window after it as well.)
    last_ms = max((r.ms for r in records), default=report.done_ms)
    events += [
        Event(
            "later-switch",
            t - report.switch_window_ms,
            min([d for d in report.demoted_ms if d >= t] or [last_ms]) + report.loss_ms,
            loss_ms=report.loss_ms,
        )
        for t in report.switches_ms
        if t > report.recovered_ms
    ]
    return events


def _dup_detail(records: list[Record], seqs: list[int], report: Fault) -> list[str]:
    """``seq: sent +ms delay D; runs: +ms a<attempt> <pid> <end kind>...`` for each of
    ``seqs``, times from the fault (the promotion is at +recovered)."""
    lines = []
    for seq in seqs:
        mine = [r for r in records if r.seq == seq]
        sent = next((r for r in mine if r.kind == SENT), None)
        runs = [
            f"+{r.ms - report.at_ms} {r.kind} a{r.attempt} {r.extra.split('.')[-1]}"
            for r in sorted(mine, key=lambda r: r.ms)
            if r.kind in (START, FINISH, FAIL)
        ]
        head = f"{seq}: sent +{sent.ms - report.at_ms} delay {sent.extra.split(',')[0]}" if sent else f"{seq}:"
        lines.append(f"{head}; {', '.join(runs)} (promoted +{report.recovered_ms - report.at_ms})")
    return lines


def _pubsub_addresses(worker: Worker) -> str:
    """Where each consumer's pub/sub connection is (host:port) and what it believes: the
    channels its client holds, whether it holds the lease and listens for announcements,
    and its subscription check's count of misses."""
    where = []
    for name, thread in worker.consumers.items():
        duty = getattr(getattr(thread, "consumer", None), "transfers", None)
        if duty is None:
            where.append(f"consumer {name}: not running")
            continue
        pubsub = duty.pubsub
        connection = getattr(pubsub, "connection", None)
        at = f"{connection.host}:{connection.port}" if connection is not None else "no pub/sub connection"
        channels = sorted(c.decode() if isinstance(c, bytes) else str(c) for c in getattr(pubsub, "channels", {}))
        where.append(
            f"consumer {name}: {at}, channels {channels}, owner {duty.timer.owner}, announcements "
            f"{duty.announcements}, wake_ready {duty.wake_ready}, misses {duty.subscription_missing}, "
            f"resubscribe attempts {duty.resubscribe_attempts}"
        )
    return ", ".join(where) or "no consumer"


def check(result: FailoverResult, size: Size, *, max_lost: int | None = None) -> None:
    """What every failover run must show: every message sent, nothing early, no
    unexplained duplicate, delayed messages flowing again within 15 s, sends accepted
    again, most sends accepted, no consumer restart, the subscription followed the
    queue; and at most ``max_lost`` lost (``None``: loss is reported, not asserted)."""
    s = result.stats
    row = result.row()
    assert s.sent == size.messages, row
    assert s.early == 0, row
    assert s.dup_unexplained == 0, row
    assert result.delayed_flow_ms is not None and result.delayed_flow_ms < 15_000, row
    assert result.sends_flow_ms is not None, row
    assert s.sent - s.refused > size.messages // 2, row
    assert result.consumer_restarts == 0, row
    assert result.resubscribed, row
    if max_lost is not None:
        assert s.lost <= max_lost, row
