"""Liveness: the messages of a killed (or stopped) worker process run again within seconds,
not after the heartbeat timeout; a live but quiet fleet is never declared dead."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import dramatiq
import pytest
import redis
from dramatiq import Worker

from dramatiq_redisson import RedissonBroker
from dramatiq_redisson._liveness import CONNECTION_GRACE, Reaper, SubscriptionCounts, confirm_behind, dead_workers
from dramatiq_redisson._transfer_duty import lapsed_renewal
from dramatiq_redisson.connection._topology import topology_for
from tests.helpers import READY, records, wait_for

ROOT = Path(__file__).resolve().parent.parent


def test_dead_is_relative_to_the_newest_beat_not_to_the_clock() -> None:
    entries = [(b"a", 10_000.0), (b"b", 8_400.0), (b"c", 8_600.0), (b"me", 5_000.0)]
    # b is 1 600 ms behind the newest beat: dead; c (1 400 ms) is not; the caller never is
    assert dead_workers(entries, 1_500, own="me") == ["b"]
    # A fleet that could not beat for a while (the server was away) is all equally old: nobody
    assert dead_workers([(b"a", 1_000.0), (b"b", 1_000.0)], 1_500, own="x") == []
    assert dead_workers([], 1_500, own="x") == []


def test_the_subscription_checks_of_one_process_make_one_call_per_server_per_interval(
    redis_client: redis.Redis,
) -> None:
    """The checks of a process's consumers (a queue's shards, a worker's queues) share one
    NUMSUB per server: a check finds the counts another took less than its ``fresh_s``
    ago, unless it asks for a channel they lack; the counts are the server's."""
    now = [100.0]
    counts = SubscriptionCounts(topology_for(redis_client), clock=lambda: now[0])

    def calls() -> int:  # "pubsub|numsub" since Redis 7, "pubsub" (all its subcommands) before
        stats = redis_client.info("commandstats")
        return int(stats.get("cmdstat_pubsub|numsub", stats.get("cmdstat_pubsub", {"calls": 0}))["calls"])

    listener = redis_client.pubsub()
    listener.subscribe("wake:a")
    try:
        redis_client.config_resetstat()
        assert counts.get("k", ["wake:a"], 0.9) == {"wake:a": 1}
        now[0] += 0.3
        assert counts.get("k", ["wake:b"], 0.9) == {"wake:b": 0}  # a channel not counted yet: a call
        now[0] += 0.3
        # Both counted by that call, 0.3 s ago: no call
        assert counts.get("k", ["wake:a"], 0.9) == {"wake:a": 1}
        assert counts.get("k", ["wake:b", "wake:a"], 0.9) == {"wake:b": 0, "wake:a": 1}
        assert calls() == 2
        now[0] += 0.7  # 1 s after it: a call again, for every channel checked lately
        listener.subscribe("wake:b")
        wait_for(lambda: redis_client.pubsub_numsub("wake:b")[0][1] == 1, timeout=2)
        redis_client.config_resetstat()
        assert counts.get("k", ["wake:a"], 0.9) == {"wake:a": 1}
        assert counts.get("k", ["wake:b"], 0.9) == {"wake:b": 1}
        assert calls() == 1
        now[0] += SubscriptionCounts.ASKED_FOR + 1  # wake:b not checked since: left out
        assert counts.get("k", ["wake:a"], 0.0) == {"wake:a": 1}
        assert counts._taken[""][1] == {"wake:a": 1}
    finally:
        listener.close()


def test_liveness_timeout_is_checked(redis_url: str) -> None:
    for bad in (50, -1, 1.5, True, "2000"):
        with pytest.raises(ValueError, match="liveness_timeout"):
            RedissonBroker(url=redis_url, liveness_timeout=bad)  # type: ignore[arg-type]
    RedissonBroker(url=redis_url, liveness_timeout=0).close()


def test_a_consumer_beats_while_it_runs_and_leaves_the_set_when_it_stops(
    broker: RedissonBroker, redis_client: redis.Redis
) -> None:
    alive = broker.keys("default").alive
    worker = Worker(broker, worker_timeout=100, worker_threads=1)
    broker.declare_queue("default")
    worker.start()
    try:
        assert wait_for(lambda: redis_client.zscore(alive, broker.broker_id) is not None, timeout=5)
        first = redis_client.zscore(alive, broker.broker_id)
        # It beats every third of liveness_timeout (2 s by default), and lists its consumer
        assert wait_for(lambda: redis_client.zscore(alive, broker.broker_id) != first, timeout=4)
        listed = redis_client.hgetall(broker.keys("default").subscribers)
        assert list(listed.values()) == [broker.broker_id.encode()]
    finally:
        worker.stop()
    # A clean stop is not a death: the process leaves the set and the list
    assert redis_client.zscore(alive, broker.broker_id) is None
    assert redis_client.hlen(broker.keys("default").subscribers) == 0


def test_the_beat_thread_outlives_an_error_that_is_not_the_servers(
    redis_url: str, redis_client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    # A beat that raises something other than a server error (the broker closing under the
    # thread, a bug) is logged with its traceback; the thread goes on beating.
    broker = RedissonBroker(url=redis_url, liveness_timeout=300)
    alive = broker.keys("default").alive
    real_beat = broker.redisson_scripts.beat
    failures = []

    def failing_beat(*args: object) -> object:
        if len(failures) < 3:
            failures.append(1)
            raise RuntimeError("not a server error")
        return real_beat(*args)

    broker.redisson_scripts.beat = failing_beat  # type: ignore[method-assign]
    try:
        broker.liveness.join("default")
        assert wait_for(lambda: redis_client.zscore(alive, broker.broker_id) is not None, timeout=5)
        assert len(failures) == 3
        assert broker.liveness._thread is not None and broker.liveness._thread.is_alive()
        logged = [r for r in caplog.records if "Liveness beat" in r.getMessage()]
        assert len(logged) == 1 and logged[0].exc_info is not None
    finally:
        broker.liveness.leave("default")
        broker.close()


@pytest.mark.parametrize(
    ("signum", "liveness_timeout", "within_s"),
    [(signal.SIGKILL, 6000, 8), (signal.SIGSTOP, 3000, 10), (signal.SIGKILL, 0, 8)],
    ids=["kill9", "stopped", "kill9-liveness-off"],
)
def test_a_killed_workers_messages_run_again_within_seconds(
    redis_url: str, redis_client: redis.Redis, signum: int, liveness_timeout: int, within_s: float
) -> None:
    """A process running two messages is killed with kill -9 (its connections close: found
    dead by its subscriptions, ~2 s) or stopped with SIGSTOP (its connections stay open,
    as a vanished host's: found dead by its beats, ``liveness_timeout``): the messages run
    again in the surviving process within seconds. With liveness off
    (``liveness_timeout=0``) they wait for the heartbeat timeout (60 s), beyond the wait."""
    survivor_broker = RedissonBroker(url=redis_url, liveness_timeout=liveness_timeout, maintenance_interval=1000)
    victim_options = {"LIVENESS_TIMEOUT": str(liveness_timeout)}
    dramatiq.set_broker(survivor_broker)

    @dramatiq.actor(queue_name="held", max_retries=0)
    def stamp(i: int) -> None:
        from tests.helpers import record

        record(redis_client, i=i)

    env = {
        **os.environ,
        "REDIS_URL": redis_url,
        "QUEUE": "held",
        "THREADS": "2",
        "HOLD_S": "60",
        "PYTHONPATH": str(ROOT),
    }
    env.update(victim_options)
    victim = subprocess.Popen([sys.executable, "-m", "tests.proc_worker"], env=env, cwd=ROOT)
    survivor = Worker(survivor_broker, worker_timeout=100, worker_threads=2)
    try:
        assert wait_for(lambda: int(redis_client.get(READY) or 0) == 1, timeout=30)
        # Given the victim running both messages
        for i in (1, 2):
            stamp.send(i)
        assert wait_for(lambda: sum(1 for r in records(redis_client) if r.get("started")) == 2, timeout=10)
        # And a surviving process consuming the same queue
        survivor.start()
        alive = survivor_broker.keys("held").alive
        if liveness_timeout:
            assert wait_for(lambda: redis_client.zcard(alive) == 2, timeout=5)
        # When the victim is killed with kill -9, or stopped
        os.kill(victim.pid, signum)
        killed = time.monotonic()
        ran = wait_for(lambda: len([r for r in records(redis_client) if not r.get("started")]) == 2, timeout=within_s)
        took = time.monotonic() - killed
    finally:
        survivor.stop()
        survivor_broker.close()
        if victim.poll() is None:
            victim.kill()
        victim.wait()
        redis_client.delete(READY)
    runs = sorted(r["i"] for r in records(redis_client) if not r.get("started"))
    if liveness_timeout:
        # Then both ran again, once each, in the survivor, seconds after the kill
        print(f"ran again {took:.2f} s after {signal.Signals(signum).name}")
        assert ran and runs == [1, 2]
        assert {r["pid"] for r in records(redis_client) if not r.get("started")} == {os.getpid()}
    else:
        assert not ran and runs == []


def test_behind_once_is_not_dead_behind_a_beat_interval_later_with_the_same_beat_is() -> None:
    entries = [(b"a", 20_000.0), (b"b", 13_000.0)]
    # First look: b is behind (7 s with a 6 s timeout), a suspect only
    dead, suspects = confirm_behind(["b"], entries, {}, now_ms=20_010, confirm_ms=2_000)
    assert dead == [] and suspects == {"b": (13_000.0, 20_010)}
    # Still behind with the same last beat a beat interval later: dead
    dead, _ = confirm_behind(["b"], entries, suspects, now_ms=22_010, confirm_ms=2_000)
    assert dead == ["b"]
    # Behind again but it beat in between (a server stall, then a slow beat): counted anew
    moved = [(b"a", 30_000.0), (b"b", 21_000.0)]
    dead, again = confirm_behind(["b"], moved, suspects, now_ms=30_010, confirm_ms=2_000)
    assert dead == [] and again == {"b": (21_000.0, 30_010)}
    # Not behind any more: forgotten
    assert confirm_behind([], entries, suspects, now_ms=22_010, confirm_ms=2_000) == ([], {})


def test_a_beat_left_behind_by_a_server_stall_is_not_a_death(broker: RedissonBroker, redis_client: redis.Redis) -> None:
    """After the server stalled (SIGSTOP, DEBUG SLEEP) the first beat to run is seconds
    ahead of the others: a live worker looks dead at that one look. It beats again at
    once, so it is left alone; one that does not beat is put back a beat interval later."""
    keys = broker.keys("default")
    timeout = broker.liveness.timeout_ms
    now = int(redis_client.time()[0]) * 1000
    for worker, message in (("live", "m1"), ("gone", "m2")):
        redis_client.hset(keys.ready_msgs, message, b"{}")
        redis_client.sadd(keys.acks(worker), message)
        redis_client.zadd(keys.alive, {worker: now - timeout - 1000})
    redis_client.zadd(keys.alive, {"first-back": now})
    reaper = Reaper(broker, "default")
    # When the lease holder checks right after the stall: both are only suspects
    assert reaper.check(time.monotonic()) == 0
    # And the live worker's beat (queued during the stall) runs
    redis_client.zadd(keys.alive, {"live": now + 10, "first-back": now + 10})
    assert reaper.check(time.monotonic() + 1) == 0
    # Then a beat interval later only the silent one is dead
    time.sleep(timeout / 3 / 1000 + 0.05)
    assert reaper.check(time.monotonic() + 2) == 1
    assert redis_client.lrange(keys.ready, 0, -1) == [b"m2"]
    assert redis_client.smembers(keys.acks("live")) == {b"m1"}


def test_the_grace_of_a_lost_subscription_outlives_the_lease_holder(
    broker: RedissonBroker, redis_client: redis.Redis
) -> None:
    """The mark of a consumer found without its subscription is kept on the server, so the
    next lease holder (a fresh Reaper) counts the grace from the same moment."""
    keys = broker.keys("default")
    now = int(redis_client.time()[0]) * 1000
    # Given a dead worker's consumer, marked unsubscribed 3 s ago, holding one message
    redis_client.hset(keys.ready_msgs, "m1", b"{}")
    redis_client.sadd(keys.acks("dead-worker"), "m1")
    redis_client.hset(keys.subscribers, "host:1:dead:1", f"dead-worker {now - 3000}")
    # And a live one, just marked (within the grace), holding another
    redis_client.hset(keys.ready_msgs, "m2", b"{}")
    redis_client.sadd(keys.acks("slow-worker"), "m2")
    redis_client.hset(keys.subscribers, "host:2:slow:1", f"slow-worker {now - 500}")
    # When a fresh reaper checks once
    requeued = Reaper(broker, "default").check(time.monotonic())
    # Then only the first is put back
    assert requeued == 1
    assert redis_client.lrange(keys.ready, 0, -1) == [b"m1"]
    assert redis_client.smembers(keys.acks("slow-worker")) == {b"m2"}
    # And a consumer that subscribes again loses its mark
    channel = keys.wake_channel("host:2:slow:1")
    pubsub = redis_client.pubsub()
    pubsub.subscribe(channel)
    try:
        assert wait_for(lambda: redis_client.pubsub_numsub(channel)[0][1] == 1)
        Reaper(broker, "default").check(time.monotonic())
        assert redis_client.hget(keys.subscribers, "host:2:slow:1") == b"slow-worker"
    finally:
        pubsub.close()


def test_a_lease_counts_as_lapsed_only_when_taken_over_at_its_end() -> None:
    # Taken over at its end, or a little after: its holder last renewed a lease before
    assert lapsed_renewal(10_000, 10_000, 2_000) == 8_000
    assert lapsed_renewal(10_000, 10_900, 2_000) == 8_000
    # Released early (a clean stop hands it over at once), or taken long after its end
    # (the server was away: every consumer is only now coming back)
    assert lapsed_renewal(10_000, 9_000, 2_000) is None
    assert lapsed_renewal(10_000, 11_001, 2_000) is None


def test_a_lapsed_lease_holder_without_its_subscription_is_dead_at_once(
    broker: RedissonBroker, redis_client: redis.Redis
) -> None:
    """The consumer whose lease lapsed, and whose subscription is gone too, is not given
    the connection grace again: it has been silent since its last renewal."""
    keys = broker.keys("default")
    now = int(redis_client.time()[0]) * 1000
    for token, worker, message in (("host:1:holder:1", "holder", "m1"), ("host:2:other:1", "other", "m2")):
        redis_client.hset(keys.ready_msgs, message, b"{}")
        redis_client.sadd(keys.acks(worker), message)
        redis_client.hset(keys.subscribers, token, worker)
    # When a reaper that took over the lapsed lease of the first checks
    reaper = Reaper(broker, "default")
    reaper.lapsed("host:1:holder:1", renewed_ms=now - CONNECTION_GRACE - 100)
    requeued = reaper.check(time.monotonic() + 10)
    # Then the lapsed holder's message is back at once; the other is only marked
    assert requeued == 1
    assert redis_client.lrange(keys.ready, 0, -1) == [b"m1"]
    assert redis_client.smembers(keys.acks("other")) == {b"m2"}
    assert redis_client.hget(keys.subscribers, "host:2:other:1").startswith(b"other ")
    # And the hint is for one check only: a later lapse of the same token is not assumed
    assert reaper._lapsed is None


@pytest.mark.slow
@pytest.mark.parametrize(("busy", "requeued"), [("python", False), ("c", True)], ids=["python-loop", "gil-held-c-call"])
def test_a_busy_actor_is_not_dead_but_a_gil_held_longer_than_the_timeout_is(
    redis_url: str, redis_client: redis.Redis, busy: str, requeued: bool
) -> None:
    """A process whose actor computes for 6 s, with ``liveness_timeout=1000``: a pure-Python
    loop lets the beat thread run (the interpreter switches threads every 5 ms), so its
    message is not run again; one C call that holds the GIL for those 6 s starves the
    beat thread, and its message (only the one in flight) runs again in the survivor: the
    documented false requeue (at-least-once)."""
    survivor_broker = RedissonBroker(url=redis_url, liveness_timeout=1000)
    dramatiq.set_broker(survivor_broker)

    @dramatiq.actor(queue_name="busy", max_retries=0)
    def stamp(i: int) -> None:
        from tests.helpers import record

        record(redis_client, i=i)

    env = {
        **os.environ,
        "REDIS_URL": redis_url,
        "QUEUE": "busy",
        "THREADS": "1",
        # Found dead after the timeout, a second look a beat interval later, and (when the
        # victim held the transfer lease) the lease's lapse: 6 s leaves room for a slow start.
        "HOLD_S": "6",
        "BUSY": busy,
        "LIVENESS_TIMEOUT": "1000",
        "PYTHONPATH": str(ROOT),
    }
    victim = subprocess.Popen([sys.executable, "-m", "tests.proc_worker"], env=env, cwd=ROOT)
    survivor = Worker(survivor_broker, worker_timeout=100, worker_threads=1)
    try:
        assert wait_for(lambda: int(redis_client.get(READY) or 0) == 1, timeout=30)
        stamp.send(1)
        assert wait_for(lambda: any(r.get("started") for r in records(redis_client)), timeout=10)
        survivor.start()
        # The victim finishes its 6 s and records its run
        assert wait_for(lambda: _victim_ran(redis_client, victim.pid), timeout=30)
        time.sleep(1.5)  # a requeue found late would show by now
    finally:
        redis_client.set("test:stop", 1)
        survivor.stop()
        survivor_broker.close()
        try:
            victim.wait(timeout=20)
        finally:
            if victim.poll() is None:
                victim.kill()
            redis_client.delete("test:workers-ready", "test:stop")
    survivor_runs = [r for r in records(redis_client) if not r.get("started") and r["pid"] == os.getpid()]
    assert len(survivor_runs) == (1 if requeued else 0)


def _victim_ran(client: redis.Redis, pid: int) -> bool:
    return any(not r.get("started") and r["pid"] == pid for r in records(client))
