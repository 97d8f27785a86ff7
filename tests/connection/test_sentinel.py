"""Sentinel failover (issue 9) and ``wait_for_replicas``.

Unit-level (the session's server, which has no replica): a write that asks for a
replica raises once ``wait_timeout`` passes, and what it wrote is on the server.

Failover (real processes from ``tests/harness/topology.py``: a primary, a replica, 3 sentinels):
a Worker (in-process threads) and a producer run on ``Sentinel.master_for`` clients;
the primary is SIGKILLed mid-run; the sentinels promote the replica; the old primary
comes back as a replica of the new one. Every send and run is recorded on the
session's server, which the fault never touches, and counted with the fault suite's
analysis (harness: ``tests/harness/failover.py``). Also run as a command for the full-size
numbers of ``docs/scaling.md``::

    python -m tests.connection.test_sentinel [--size small|full] [--json]
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import dramatiq
import pytest
import redis
from dramatiq import Worker

from dramatiq_redisson import EnqueueNotReplicated, NotReplicated, RedissonBroker
from tests.harness import failover
from tests.harness.failover import QUEUE, SIZES, FailoverResult, Fault, Size
from tests.harness.topology import Sentinel
from tests.helpers import wait_for

# -- wait_for_replicas on a server without replicas -------------------------------------


@pytest.fixture
def lonely(redis_url: str, redis_client: redis.Redis) -> Iterator[RedissonBroker]:
    """A broker asking for one replica on the session's server, which has none."""
    broker = RedissonBroker(url=redis_url, wait_for_replicas=1, wait_timeout=100)
    yield broker
    broker.flush_all()
    broker.close()


def _message(broker: RedissonBroker, i: int = 0) -> dramatiq.Message[Any]:
    return dramatiq.Message(queue_name="default", actor_name="noop", args=(i,), kwargs={}, options={})


def test_options_are_checked(redis_url: str) -> None:
    for bad in ({"wait_for_replicas": -1}, {"wait_for_replicas": True}, {"wait_timeout": 0}, {"wait_timeout": 1.5}):
        with pytest.raises(ValueError, match="wait_"):
            RedissonBroker(url=redis_url, **bad)  # type: ignore[arg-type]


def test_a_delayed_send_without_a_replica_raises_after_the_timeout(lonely: RedissonBroker) -> None:
    message = _message(lonely)
    began = time.monotonic()
    with pytest.raises(EnqueueNotReplicated) as caught:
        lonely.enqueue(message, delay=60_000)
    assert 0.09 <= time.monotonic() - began < 2
    error = caught.value
    assert isinstance(error, NotReplicated) and isinstance(error, dramatiq.errors.BrokerError)
    assert (error.replicas, error.wanted, error.timeout_ms) == (0, 1, 100)
    assert [m.message_id for m in error.enqueued] == [message.message_id] and not error.failed
    assert "0 of the 1 replica(s)" in str(error)
    # It is on the primary: sending it again is safe (rescheduled, still one entry).
    assert lonely.delayed_queue("default").contains(message.message_id)
    with pytest.raises(EnqueueNotReplicated):
        lonely.enqueue(message, delay=60_000)
    assert lonely.delayed_queue("default").size() == 1


def test_an_immediate_send_and_a_batch_without_a_replica_raise(lonely: RedissonBroker) -> None:
    with pytest.raises(EnqueueNotReplicated):
        lonely.enqueue(_message(lonely))
    assert lonely.client.llen("dramatiq:default") == 1
    batch = [_message(lonely, i) for i in range(250)]  # three streamed calls, one WAIT
    with pytest.raises(EnqueueNotReplicated) as caught:
        lonely.enqueue_many(batch, delay=60_000)
    assert len(caught.value.enqueued) == 250 and caught.value.replicas == 0
    assert lonely.delayed_queue("default").size() == 250


def test_a_cancel_without_a_replica_raises(lonely: RedissonBroker, redis_url: str) -> None:
    plain = RedissonBroker(url=redis_url)
    try:
        message = plain.enqueue(_message(plain), delay=60_000)
    finally:
        plain.close()
    with pytest.raises(NotReplicated) as caught:
        lonely.delayed_queue("default").remove(message.message_id)
    assert caught.value.reply == 1  # type: ignore[attr-defined]
    assert not lonely.delayed_queue("default").contains(message.message_id)


def test_a_worker_without_a_replica_still_moves_and_runs_delayed_messages(
    lonely: RedissonBroker, redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The transfer goes through on the primary; the consumer logs that it is not
    replicated and transfers again soon, but never holds messages back or crashes."""
    plain = RedissonBroker(url=redis_url)
    ran: list[int] = []

    @dramatiq.actor(broker=lonely, queue_name="default", actor_name="noop")
    def noop(i: int) -> None:
        ran.append(i)

    try:
        for i in range(5):
            plain.enqueue(_message(plain, i), delay=200)
    finally:
        plain.close()
    worker = Worker(lonely, worker_timeout=100, worker_threads=2)
    caplog.set_level(logging.WARNING, logger="dramatiq_redisson.RedissonConsumer")
    worker.start()
    try:
        assert wait_for(lambda: sorted(ran) == list(range(5)), timeout=10), ran
    finally:
        worker.stop()
    assert any("replica(s)" in r.getMessage() for r in caplog.records), [r.getMessage() for r in caplog.records]
    assert not any("Consumer encountered" in r.getMessage() for r in caplog.records)


def test_without_wait_for_replicas_no_wait_is_sent(redis_url: str, redis_client: redis.Redis) -> None:
    """wait_for_replicas=0 sends no WAIT at all (and so needs no +wait)."""

    def waits() -> int:
        return int(redis_client.info("commandstats").get("cmdstat_wait", {}).get("calls", 0))

    broker = RedissonBroker(url=redis_url)
    try:
        assert broker.redisson_scripts.wait_for_replicas == 0
        before = waits()
        broker.enqueue(_message(broker), delay=60_000)
        broker.enqueue_many([_message(broker, 1)])
        broker.delayed_queue("default").remove(_message(broker, 2).message_id)
        assert waits() == before
    finally:
        broker.flush_all()
        broker.close()


# -- failover --------------------------------------------------------------------------

#: A failover may lose what the old primary acknowledged but had not replicated yet:
#: runs (and their acks) in this window before the kill explain a duplicate.
FAILOVER_LOSS_MS = 1000


class _SwitchWatcher:
    """Stamps each promotion (``+switch-master``, from the first sentinel) into the
    run's :class:`Fault` (``switches_ms``, record clock) from the fault on: on a loaded
    machine the sentinels may fail over again, and that failover explains duplicates of
    its own (see ``tests/harness/failover.py``)."""

    def __init__(self, setup: Sentinel) -> None:
        self.setup = setup
        self.stopped = threading.Event()
        self.thread: threading.Thread | None = None

    def __enter__(self) -> _SwitchWatcher:
        return self

    def start(self, now_ms: Callable[[], int], report: Fault) -> None:
        # Taken for down after down_after_ms without a reply, then a vote and a promotion.
        report.switch_window_ms = self.setup.down_after_ms + 1000
        pubsub = self.setup.admin(self.setup.sentinel_servers[0]).pubsub()
        pubsub.psubscribe("*")

        def watch() -> None:
            try:
                while not self.stopped.is_set():
                    message = pubsub.get_message(ignore_subscribe_messages=True, timeout=0.1)
                    if message is None:
                        continue
                    # The admin client decodes replies.
                    at, channel, data = now_ms(), str(message["channel"]), str(message["data"])
                    if channel == "+switch-master":
                        report.switches_ms.append(at)
                    elif channel == "+convert-to-slave" or data.endswith("new reported role is slave"):
                        report.demoted_ms.append(at)
                    if channel != "__sentinel__:hello":
                        report.timeline.append((at, f"sentinel {channel} {data}"))
            finally:
                pubsub.close()

        self.thread = threading.Thread(target=watch, daemon=True)
        self.thread.start()

    def __exit__(self, *exc: object) -> None:
        self.stopped.set()
        if self.thread is not None:
            self.thread.join(timeout=5)


def run_failover(records_url: str, wait_for_replicas: int, size: Size) -> FailoverResult:
    """One run (see ``tests/harness/failover.py``) on ``master_for`` clients: the primary is
    SIGKILLed, the sentinels promote the replica, the old primary comes back as a
    replica of the new one."""
    with Sentinel(replicas=1, sentinels=3, down_after_ms=1000) as setup, _SwitchWatcher(setup) as switches:

        def fault(broker: RedissonBroker, now_ms: Callable[[], int], report: Fault) -> None:
            report.at_ms, report.loss_ms = now_ms(), FAILOVER_LOSS_MS
            switches.start(now_ms, report)
            old = setup.kill_primary()
            report.timeline.append((now_ms(), f"killed {old.port}"))
            _, report.recovery_s = setup.wait_for_failover()
            report.recovered_ms = now_ms()
            report.timeline.append((now_ms(), f"restarting {old.port} as a replica of {setup.primary.port}"))
            setup.restart(old, follow_primary=True)
            report.timeline.append((now_ms(), f"{old.port} started"))
            setup.wait_for_replica(old)
            report.done_ms = now_ms()
            report.timeline.append((now_ms(), f"{old.port} replicates with its link up"))

        def counts(broker: RedissonBroker) -> dict[int, tuple[str, int]]:
            """Each running data server's role (its own INFO) and subscribers of the
            queue's channel."""
            channel = broker.keys(QUEUE).channel
            seen = {}
            for server in setup.data_servers:
                if server.running:
                    subscribers = dict(setup.admin(server).pubsub_numsub(channel)).get(channel, 0)
                    seen[server.port] = (setup.role(server), subscribers)
            return seen

        def subscribed(broker: RedissonBroker) -> bool:
            # On the server that is the primary now, by its own account: on a loaded
            # machine (down-after 1 s) the sentinels may fail over a second time, and the
            # consumer follows that one too; and one sentinel may still name the old one.
            return any(role == "master" and n >= 1 for role, n in counts(broker).values())

        def describe(broker: RedissonBroker) -> str:
            servers = ", ".join(f"{port} {role} {n} subscribed" for port, (role, n) in counts(broker).items())
            return f"servers: {servers}; the sentinels name: {', '.join(map(str, setup.named_primary_ports()))}"

        return failover.run_failover(
            records_url,
            label="sentinel-kill9",
            size=size,
            wait_for_replicas=wait_for_replicas,
            make_client=setup.client,
            fault=fault,
            subscribed=subscribed,
            describe=describe,
        )


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_failover_without_and_with_wait_for_replicas(redis_url: str) -> None:
    """Kill the primary mid-run, with wait_for_replicas 0 and 1. Both: nothing early, no
    unexplained duplicate, delayed messages flow again within a few seconds of the
    promotion, no consumer restart. With 1: no accepted message lost. With 0 the loss
    (acknowledged writes the replica had not received) is reported, not asserted."""
    results = [run_failover(redis_url, w, SIZES["small"]) for w in (0, 1)]
    print("\n" + "\n".join(json.dumps(r.row()) for r in results))
    for result in results:
        failover.check(result, SIZES["small"], max_lost=0 if result.wait_for_replicas else None)


def test_a_paused_queue_stays_paused_through_a_failover_and_its_history_is_kept() -> None:
    """The pause and the history are replicated data: after the primary is killed and a
    replica promoted, a Worker on the Sentinel client still starts nothing of the paused
    queue, the counts taken before the failover are still there, and a resume runs all."""
    ran: list[int] = []
    with Sentinel(replicas=1, sentinels=3) as setup:
        broker = RedissonBroker(client=setup.client(), wait_for_replicas=1)

        @dramatiq.actor(broker=broker, queue_name="live", max_retries=0)
        def job(i: int) -> None:
            ran.append(i)

        worker = Worker(broker, worker_timeout=100, worker_threads=2)
        worker.start()
        try:
            job.send(0)
            assert wait_for(lambda: ran == [0], timeout=10)
            assert broker.pause("live")
            for i in range(1, 4):
                job.send(i)
            setup.kill_primary()
            setup.wait_for_failover()
            assert wait_for(lambda: broker.stats("live")["queues"]["live"]["ready"] == 3, timeout=20)
            time.sleep(1.0)
            assert ran == [0], "a paused queue stays paused on the promoted replica"
            assert broker.stats("live")["queues"]["live"]["last_hour"]["processed"] == 1
            assert wait_for(lambda: _resumed(broker), timeout=10)
            assert wait_for(lambda: sorted(ran) == [0, 1, 2, 3], timeout=10)
        finally:
            worker.stop()
            broker.close()


def test_limits_and_lanes_survive_a_failover() -> None:
    """Limits, priorities and groups are replicated data: after the primary is killed and
    a replica promoted, the limits read the same, the queued messages are still in their
    lanes, and a Worker runs them by priority, one at a time per group, with every slot
    given back."""
    ran: list[tuple[str, int]] = []
    with Sentinel(replicas=1, sentinels=3) as setup:
        broker = RedissonBroker(client=setup.client(), wait_for_replicas=1, max_priority=5)

        @dramatiq.actor(broker=broker, queue_name="live", max_retries=0)
        def job(group: str, i: int) -> None:
            ran.append((group, i))

        broker.declare_queue("live")
        broker.pause("live")
        limits = broker.limits.set("live", concurrency=2, group_concurrency=1, rate=50, per_ms=1000)
        for i in range(3):
            job.send_with_options(args=("a", i), group_key="a")
            job.send_with_options(args=("b", i), group_key="b")
        job.send_with_options(args=("urgent", 0), broker_priority=5)
        setup.kill_primary()
        setup.wait_for_failover()
        assert wait_for(lambda: _limits(broker) == limits, timeout=20)
        assert broker.stats("live")["queues"]["live"]["ready_by_priority"] == {5: 1, 0: 6}
        worker = Worker(broker, worker_timeout=100, worker_threads=1)
        worker.start()
        try:
            assert wait_for(lambda: _resumed(broker), timeout=10)
            assert wait_for(lambda: len(ran) == 7, timeout=15)
        finally:
            worker.stop()
        assert ran[0] == ("urgent", 0)
        assert [i for g, i in ran if g == "a"] == [0, 1, 2] and [i for g, i in ran if g == "b"] == [0, 1, 2]
        assert wait_for(lambda: broker.limits.get("live")["in_use"] == 0)
        broker.close()


def _limits(broker: RedissonBroker) -> Any:
    try:
        return broker.limits.get("live")
    except (redis.ConnectionError, NotReplicated):
        return None


def _resumed(broker: RedissonBroker) -> bool:
    """Resume (retried through the failover's lost connections)."""
    try:
        broker.resume("live")
        return True
    except (redis.ConnectionError, NotReplicated):
        return False


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_sends_follow_a_switch_away_from_a_primary_that_is_still_alive() -> None:
    """The primary stalls (SIGSTOP) past down-after: the sentinels promote the replica.
    Resumed, the old primary is alive and still a primary until the sentinels turn it into
    a replica, seconds later, which discards what it took meanwhile. A producer that kept
    its pooled connections there (redis-py asks the sentinels only for a new connection)
    would lose every send of those seconds; ours moves within a second of the switch
    (``_primary_watch``). Counted on the promoted primary: the accepted sends it lacks."""
    with Sentinel(replicas=1, sentinels=3, down_after_ms=1000) as setup:
        broker = RedissonBroker(client=setup.client())
        accepted: dict[str, float] = {}  # message id -> when its send returned
        stop = threading.Event()

        def send_forever() -> None:
            i = 0
            while not stop.is_set():
                message = dramatiq.Message(queue_name="follow", actor_name="noop", args=(i,), kwargs={}, options={})
                try:
                    broker.enqueue(message)
                    accepted[message.message_id] = time.monotonic()
                except redis.RedisError:
                    pass  # refused during the failover: not counted
                i += 1
                time.sleep(0.02)

        sender = threading.Thread(target=send_forever, daemon=True)
        try:
            sender.start()
            assert wait_for(lambda: len(accepted) >= 20, timeout=10)
            old = setup.primary
            setup.kill(old, signal.SIGSTOP)
            (_, new_port), _ = setup.wait_for_failover()
            resumed = time.monotonic()
            setup.kill(old, signal.SIGCONT)
            # Still a primary, with writes, until the sentinels convert it.
            assert wait_for(lambda: setup.role(old) == "slave", timeout=40, interval=0.05)
            stale_s = time.monotonic() - resumed
            setup.wait_for_replica(old)
            time.sleep(0.5)
        finally:
            stop.set()
            sender.join(timeout=10)
            broker.close()
        new = next(s for s in setup.data_servers if s.port == new_port)
        # An immediate message's redis id is its message id (_message.ready_id).
        kept = set(setup.admin(new).hkeys(broker.keys("follow").ready_msgs))
        after_resume = [m for m, at in accepted.items() if at > resumed]
        lost = [m for m, at in accepted.items() if m not in kept]
        lost_late = [m for m in lost if accepted[m] > resumed + 1.5]
        summary = (
            f"stale {stale_s:.1f} s, {len(accepted)} accepted ({len(after_resume)} after the resume), "
            f"lost {len(lost)} ({len(lost_late)} of them over 1.5 s after the resume)"
        )
        print(f"\nfollow: {summary}")
        assert stale_s > 2.0, f"the old primary was converted at once: nothing to follow ({summary})"
        assert len(after_resume) > 50, summary
        assert lost_late == [], summary
        assert len(lost) <= 2 * 50 * 1.5, summary


# -- the cost of waiting ---------------------------------------------------------------


def offer_rates(seconds: float = 3.0) -> dict[int, float]:
    """Delayed offers per second from one thread, wait_for_replicas 0 and 1, same setup."""
    rates: dict[int, float] = {}
    with Sentinel(replicas=1, sentinels=3) as setup:
        for w in (0, 1, 0, 1):
            broker = RedissonBroker(client=setup.client(), wait_for_replicas=w)
            try:
                count = 0
                end = time.monotonic() + seconds
                while time.monotonic() < end:
                    message = dramatiq.Message(queue_name="bench", actor_name="a", args=(count,), kwargs={}, options={})
                    broker.enqueue(message, delay=3_600_000)
                    count += 1
                rates[w] = max(rates.get(w, 0.0), count / seconds)
                broker.flush("bench")
            finally:
                broker.close()
    return rates


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.connection.test_sentinel")
    parser.add_argument("--size", choices=sorted(SIZES), default="full")
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    from dramatiq_redisson.embedded import redis_url

    rows = []
    with redis_url() as url:  # the record server: never faulted
        for _ in range(args.runs):
            for w in (0, 1):
                rows.append(run_failover(url, w, SIZES[args.size]).row())
                print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    rates = offer_rates()
    print(json.dumps({"failover": rows, "offers_per_s": rates}, indent=None if args.json else 2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
