"""Concurrency limits per queue and per group (flow control; ``broker.limits``), through real
workers on the real server: a queue never runs more than its limit at once across
processes, a group's messages run one at a time in order with a group limit of 1 while
other groups run beside it, a limit changed while workers run takes effect, a killed
worker's slots come back with its messages, and every in-use count ends at 0."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import dramatiq
import pytest
import redis
from dramatiq import Worker
from dramatiq.middleware import default_middleware

from dramatiq_redisson import RedissonBroker
from tests.helpers import READY, record, records, stop_worker_processes, wait_for

ROOT = Path(__file__).resolve().parents[2]

#: Count a run in and out, keeping the highest count seen: KEYS[1] the count, KEYS[2] the high mark.
_ENTER = """
local n = redis.call("INCR", KEYS[1])
if n > tonumber(redis.call("GET", KEYS[2]) or 0) then
    redis.call("SET", KEYS[2], n)
end
return n
"""


@pytest.fixture
def limited(redis_url: str) -> Iterator[RedissonBroker]:
    broker = RedissonBroker(url=redis_url, middleware=[m() for m in default_middleware], max_priority=9)
    dramatiq.set_broker(broker)
    yield broker
    broker.flush_all()
    broker.close()


def _runner(client: redis.Redis, hold_s: float = 0.05) -> Callable[..., Any]:
    enter = client.register_script(_ENTER)

    @dramatiq.actor(max_retries=0)
    def job(i: Any, group: str = "") -> None:
        enter(keys=["test:running", "test:running:max"])
        if group:
            enter(keys=[f"test:running:{group}", f"test:running:{group}:max"])
        record(client, i=i, group=group)
        time.sleep(hold_s)
        if group:
            client.decr(f"test:running:{group}")
        client.decr("test:running")

    return job


def _high(client: redis.Redis, key: str = "test:running:max") -> int:
    return int(client.get(key) or 0)


def _workers(broker: RedissonBroker, count: int, threads: int) -> list[Worker]:
    workers = [Worker(broker, worker_timeout=100, worker_threads=threads) for _ in range(count)]
    for worker in workers:
        worker.start()
    return workers


def _idle(broker: RedissonBroker, queue_name: str = "default") -> bool:
    now = broker.limits.get(queue_name)
    return now["in_use"] == 0 and now["groups_in_use"] == 0 and now["lanes_blocked"] == 0


def test_a_queue_limit_bounds_how_many_run_at_once_across_workers(
    limited: RedissonBroker, redis_client: redis.Redis
) -> None:
    job = _runner(redis_client)
    # Given a limit of 3 on a queue served by 2 workers x 4 threads
    assert limited.limits.set("default", concurrency=3)["concurrency"] == 3
    for i in range(40):
        job.send(i)
    workers = _workers(limited, 2, 4)
    try:
        assert wait_for(lambda: len(records(redis_client)) == 40, timeout=30)
        limited.join("default", timeout=10_000)
    finally:
        for worker in workers:
            worker.stop()
    # Then never more than 3 ran at once, and every slot came back
    assert 1 <= _high(redis_client) <= 3
    assert sorted(r["i"] for r in records(redis_client)) == list(range(40))
    assert _idle(limited)


def test_a_group_limit_of_1_runs_each_groups_messages_one_at_a_time_in_order_beside_other_groups(
    limited: RedissonBroker, redis_client: redis.Redis
) -> None:
    job = _runner(redis_client)
    limited.limits.set("default", group_concurrency=1)
    for i in range(10):
        for group in ("a", "b", "c"):
            job.send_with_options(args=(i, group), group_key=group)
    workers = _workers(limited, 2, 4)
    try:
        assert wait_for(lambda: len(records(redis_client)) == 30, timeout=30)
        limited.join("default", timeout=10_000)
    finally:
        for worker in workers:
            worker.stop()
    # Each group one at a time, in send order; the groups ran beside each other
    for group in ("a", "b", "c"):
        assert _high(redis_client, f"test:running:{group}:max") == 1
        assert [r["i"] for r in records(redis_client) if r["group"] == group] == list(range(10))
    assert _high(redis_client) >= 2
    assert _idle(limited)


def test_a_limit_changed_while_workers_run_takes_effect(limited: RedissonBroker, redis_client: redis.Redis) -> None:
    job = _runner(redis_client, hold_s=0.1)
    limited.limits.set("default", concurrency=1)
    for i in range(60):
        job.send(i)
    workers = _workers(limited, 2, 4)
    try:
        assert wait_for(lambda: len(records(redis_client)) >= 5, timeout=10)
        assert _high(redis_client) == 1
        # When the limit is raised to 6 while they run
        limited.limits.set("default", concurrency=6)
        assert wait_for(lambda: _high(redis_client) >= 4, timeout=10)
        # and lowered to 2: once the running ones finish, at most 2 at once
        limited.limits.set("default", concurrency=2)
        redis_client.set("test:running:max", 0)
        time.sleep(0.5)  # messages started under the limit of 6 finish (0.1 s each)
        redis_client.set("test:running:max", 0)
        assert wait_for(lambda: len(records(redis_client)) == 60, timeout=30)
        assert _high(redis_client) <= 2
        limited.join("default", timeout=10_000)
    finally:
        for worker in workers:
            worker.stop()
    assert _idle(limited)
    # and clearing the limits keeps priorities and groups (the queue stays on lanes)
    assert limited.limits.clear("default")["concurrency"] is None
    assert redis_client.exists(limited.keys("default").flow) == 1


@pytest.mark.parametrize(
    "bad",
    [
        {"concurrency": 0},
        {"concurrency": -1},
        {"concurrency": 1.5},
        {"concurrency": True},
        {"concurrency": 10**9 + 1},
        {"group_concurrency": "2"},
    ],
)
def test_a_bad_limit_raises_and_writes_nothing(
    limited: RedissonBroker, redis_client: redis.Redis, bad: dict[str, Any]
) -> None:
    before = redis_client.dbsize()
    with pytest.raises(ValueError, match="concurrency"):
        limited.limits.set("default", **bad)
    assert redis_client.dbsize() == before


def test_limits_get_reads_the_limits_and_what_is_in_use(limited: RedissonBroker) -> None:
    # A queue must be known first (a typo would limit, or read as, a queue nobody consumes)
    for call in (limited.limits.get, lambda name: limited.limits.set(name, concurrency=5)):
        with pytest.raises(ValueError, match="'fresh': not a known queue"):
            call("fresh")
    assert limited.client.exists(limited.keys("fresh").flow) == 0
    limited.declare_queue("fresh")
    assert limited.limits.get("fresh") == {
        "concurrency": None,
        "rate": None,
        "per_ms": None,
        "group_concurrency": None,
        "group_rate": None,
        "in_use": 0,
        "groups_in_use": 0,
        "lanes_blocked": 0,
        "started_in_window": None,
        "lanes_deferred": 0,
    }
    limited.limits.set("fresh", concurrency=5, group_concurrency=2)
    assert limited.limits.get("fresh")["concurrency"] == 5
    assert limited.limits.get("fresh")["group_concurrency"] == 2
    limited.limits.set("fresh", group_concurrency=1)  # exactly these: the queue limit goes
    assert limited.limits.get("fresh")["concurrency"] is None


def flow_hash(broker: RedissonBroker, queue_name: str = "default") -> dict[bytes, bytes]:
    return broker.client.hgetall(broker.keys(queue_name).flow)  # type: ignore[no-any-return]


def test_update_changes_only_the_limits_named_and_keeps_the_others(limited: RedissonBroker) -> None:
    limited.declare_queue("default")
    limited.limits.set("default", concurrency=8, group_concurrency=1)
    now = limited.limits.update("default", concurrency=4)
    assert (now["concurrency"], now["group_concurrency"]) == (4, 1)
    assert limited.limits.get("default") == now
    # A rate joins the limits kept; None removes one limit only
    limited.limits.update("default", rate=10, per_ms=1000)
    got = limited.limits.get("default")
    assert (got["concurrency"], got["group_concurrency"], got["rate"], got["per_ms"]) == (4, 1, 10, 1000)
    limited.limits.update("default", group_concurrency=None, group_rate=2)
    got = limited.limits.get("default")
    assert (got["concurrency"], got["group_concurrency"], got["rate"], got["group_rate"]) == (4, None, 10, 2)
    # set still means exactly these
    limited.limits.set("default", group_concurrency=3)
    got = limited.limits.get("default")
    assert (got["concurrency"], got["group_concurrency"], got["rate"], got["per_ms"]) == (None, 3, None, None)


@pytest.mark.parametrize(
    ("changes", "fragment"),
    [
        ({}, "got none"),
        ({"concurency": 4}, "'concurency'"),
        ({"concurrency": 0}, "concurrency must be an int from 1"),
        ({"per_ms": None}, "rate and group_rate need their window"),  # the rate kept would lose its window
        ({"rate": None, "group_rate": None, "concurrency": 2}, "need their window"),  # the window kept: no rate
    ],
)
def test_update_refuses_bad_changes_and_writes_nothing(
    limited: RedissonBroker, redis_client: redis.Redis, changes: dict[str, Any], fragment: str
) -> None:
    limited.declare_queue("default")
    limited.limits.set("default", concurrency=8, rate=10, per_ms=1000)
    before = flow_hash(limited)
    with pytest.raises(ValueError, match=fragment):
        limited.limits.update("default", **changes)
    assert flow_hash(limited) == before


def test_update_of_a_sharded_queue_keeps_the_limits_asked_for_the_whole_queue(redis_url: str) -> None:
    broker = RedissonBroker(url=redis_url, middleware=[], shards={"default": 2})
    try:
        broker.declare_queue("default")
        [first, second] = broker.shards_of("default")
        broker.limits.set("default", concurrency=8, group_concurrency=1)
        now = broker.limits.update("default", concurrency=4)
        assert (now["concurrency"], now["group_concurrency"]) == (4, 1)
        # Each shard has its share of the queue limit, and the group limit whole
        assert flow_hash(broker, first)[b"concurrency"] == flow_hash(broker, second)[b"concurrency"] == b"2"
        assert flow_hash(broker, second)[b"group_concurrency"] == b"1"
    finally:
        broker.flush_all()
        broker.close()


def test_a_nacked_message_gives_its_slot_back(limited: RedissonBroker, redis_client: redis.Redis) -> None:
    @dramatiq.actor(max_retries=0)
    def fails(i: int) -> None:
        record(redis_client, i=i)
        raise RuntimeError("to the dead letters")

    limited.limits.set("default", concurrency=1, group_concurrency=1)
    for i in range(3):
        fails.send_with_options(args=(i,), group_key="g")
    workers = _workers(limited, 1, 2)
    try:
        assert wait_for(lambda: len(records(redis_client)) == 3, timeout=10)
        limited.join("default", timeout=10_000)
    finally:
        for worker in workers:
            worker.stop()
    assert limited.stats("default")["queues"]["default"]["dead"] == 3
    assert _idle(limited)


def _victim(redis_url: str, threads: int = 2, hold_s: float = 60) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "REDIS_URL": redis_url,
        "QUEUE": "limited",
        "THREADS": str(threads),
        "HOLD_S": str(hold_s),
        "PYTHONPATH": str(ROOT),
    }
    return subprocess.Popen([sys.executable, "-m", "tests.proc_worker"], env=env, cwd=ROOT)


@contextmanager
def victim_beside(
    redis_url: str,
    redis_client: redis.Redis,
    survivor_broker: RedissonBroker,
    *,
    hold_s: float = 60,
    timeout_ms: int = 100,
) -> Iterator[tuple[subprocess.Popen[bytes], Worker]]:
    """A worker process to kill (:func:`_victim`, ready when this yields) and a Worker of
    ``survivor_broker`` to take over, not started; at exit both stop, and the broker is
    flushed and closed."""
    victim = _victim(redis_url, hold_s=hold_s)
    survivor = Worker(survivor_broker, worker_timeout=timeout_ms, worker_threads=2)
    try:
        assert wait_for(lambda: int(redis_client.get(READY) or 0) == 1, timeout=30)
        yield victim, survivor
    finally:
        survivor.stop()
        survivor_broker.flush_all()
        survivor_broker.close()
        if victim.poll() is None:
            victim.kill()
        victim.wait()
        redis_client.delete(READY)


def test_a_killed_worker_holding_a_groups_only_slot_gives_it_back_within_the_liveness_time(
    redis_url: str, redis_client: redis.Redis
) -> None:
    survivor_broker = RedissonBroker(url=redis_url, maintenance_interval=1000)
    dramatiq.set_broker(survivor_broker)

    @dramatiq.actor(queue_name="limited", max_retries=0)
    def stamp(i: int) -> None:
        record(redis_client, i=i)

    survivor_broker.limits.set("limited", group_concurrency=1)
    with victim_beside(redis_url, redis_client, survivor_broker) as (victim, survivor):
        # Given the victim running the group's first message (its only slot) and the
        # group's second message waiting for it
        for i in (1, 2):
            stamp.send_with_options(args=(i,), group_key="tenant")
        assert wait_for(lambda: [r["i"] for r in records(redis_client) if r.get("started")] == [1], timeout=10)
        assert survivor_broker.limits.get("limited")["groups_in_use"] == 1
        survivor.start()
        time.sleep(0.5)
        assert [r for r in records(redis_client) if not r.get("started")] == []  # the group waits
        # When the victim is killed with kill -9
        os.kill(victim.pid, signal.SIGKILL)
        killed = time.monotonic()
        # Then the group runs again in the survivor: its first message, then the second
        ran = wait_for(lambda: len([r for r in records(redis_client) if not r.get("started")]) == 2, timeout=10)
        took = time.monotonic() - killed
        assert ran, records(redis_client)
        print(f"the group ran again {took:.2f} s after kill -9")
        assert [r["i"] for r in records(redis_client) if not r.get("started")] == [1, 2]
        survivor_broker.join("limited", timeout=10_000)
        assert _idle(survivor_broker, "limited")


@pytest.mark.slow
def test_random_kills_leak_no_slot(redis_url: str, redis_client: redis.Redis) -> None:
    """Worker processes are killed with kill -9 at random moments while they run messages of
    six groups under a queue limit and a group limit: every message runs, and once the
    queue is done every in-use count is back to 0."""
    rng = random.Random(35)
    broker = RedissonBroker(url=redis_url)
    dramatiq.set_broker(broker)

    @dramatiq.actor(queue_name="limited", max_retries=0)
    def stamp(i: int) -> None:
        record(redis_client, i=i)

    broker.limits.set("limited", concurrency=4, group_concurrency=2)
    for i in range(90):
        broker.enqueue(stamp.message_with_options(args=(i,), group_key=f"g{i % 6}"))
    victims = [_victim(redis_url, threads=3, hold_s=0.3) for _ in range(3)]
    survivor = Worker(broker, worker_timeout=100, worker_threads=2)
    try:
        assert wait_for(lambda: int(redis_client.get(READY) or 0) == 3, timeout=30)
        survivor.start()
        for _ in range(4):
            time.sleep(rng.uniform(0.3, 1.2))
            victim = victims.pop(rng.randrange(len(victims)))
            victim.kill()  # SIGKILL
            victim.wait()
            victims.append(_victim(redis_url, threads=3, hold_s=0.3))
        done = lambda: {r["i"] for r in records(redis_client) if not r.get("started")} == set(range(90))  # noqa: E731
        assert wait_for(done, timeout=60), sorted({r["i"] for r in records(redis_client) if not r.get("started")})
        broker.join("limited", timeout=30_000)
        assert wait_for(lambda: _idle(broker, "limited"), timeout=10), broker.limits.get("limited")
    finally:
        survivor.stop()
        stop_worker_processes(redis_client, victims)
        broker.flush_all()
        broker.close()


def test_a_group_held_back_by_its_limit_shows_in_stats_and_is_flushed(
    limited: RedissonBroker, redis_client: redis.Redis
) -> None:
    @dramatiq.actor(max_retries=0)
    def slow(i: int) -> None:
        record(redis_client, i=i)
        time.sleep(5)

    limited.limits.set("default", group_concurrency=1)
    for i in range(3):
        slow.send_with_options(args=(i,), group_key="g")
    workers = _workers(limited, 1, 2)
    try:
        assert wait_for(lambda: len(records(redis_client)) == 1, timeout=10)
        # Given the group's first message running and two held back by the group's limit
        assert wait_for(lambda: limited.limits.get("default")["lanes_blocked"] == 1, timeout=5)
        stats = limited.stats("default")["queues"]["default"]
        assert (stats["ready"], stats["in_flight"], stats["lanes_waiting"]) == (2, 1, 1)
        assert limited.waiting_groups("default") == [
            {"priority": 0, "group": "g", "ready": 2, "blocked": True, "until_ms": None}
        ]
        # When the queue is flushed, the held-back lane goes with it
        limited.flush("default")
        assert redis_client.exists(limited.keys("default").lane("0:" + b"g".hex())) == 0
    finally:
        for worker in workers:
            worker.stop()
