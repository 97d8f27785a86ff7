"""A queue over several shards (issue 36, first steps; docs/sharding-design.md), on one
server: sends spread over the shards (keyed ones to their key's shard), one Worker runs
every message once whatever its shard, retries go back to their shard, and a queue not
named in ``shards`` keeps its one set of keys."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import dramatiq
import pytest
import redis
from dramatiq import Worker
from dramatiq.middleware import default_middleware

from dramatiq_redisson import RedissonBroker
from dramatiq_redisson.embedded import redis_url as embedded_redis_url
from tests.helpers import record, records, wait_for
from tests.test_processes import worker_processes


@pytest.fixture
def sharded(redis_url: str) -> Iterator[RedissonBroker]:
    broker = RedissonBroker(url=redis_url, middleware=[m() for m in default_middleware], shards={"default": 4})
    dramatiq.set_broker(broker)
    yield broker
    broker.flush_all()
    broker.close()


def _job(client: redis.Redis) -> Any:
    @dramatiq.actor(max_retries=2, min_backoff=50, max_backoff=100)
    def job(i: int, fail: bool = False) -> None:
        record(client, i=i)
        if fail and len([r for r in records(client) if r["i"] == i]) == 1:
            raise RuntimeError("once")

    return job


def _ready_per_shard(broker: RedissonBroker, redis_client: redis.Redis) -> Counter[str]:
    """Each shard's ready messages (in all its lanes)."""
    shards = broker.stats("default")["queues"]["default"]["shards"]
    return Counter({name: shards[name]["ready"] for name in broker.shard_router.consumed("default")})


def test_sends_spread_over_the_shards_and_keyed_ones_go_to_their_keys_shard(
    sharded: RedissonBroker, redis_client: redis.Redis
) -> None:
    job = _job(redis_client)
    names = sharded.shard_router.consumed("default")
    assert len(names) == 4 and names[0] == "default" and all(n.startswith("default~") for n in names[1:])
    for i in range(40):
        job.send(i)
    per_shard = _ready_per_shard(sharded, redis_client)
    assert sorted(per_shard.values()) == [10, 10, 10, 10]  # in turn
    for i in range(8):
        job.send_with_options(args=(100 + i,), group_key="tenant-a")
    after = _ready_per_shard(sharded, redis_client)
    grew = [name for name in names if after[name] > per_shard[name]]
    assert len(grew) == 1 and after[grew[0]] - per_shard[grew[0]] == 8  # one shard for the group
    # Every shard's keys carry its own tag
    assert len({sharded.keys(name).ready for name in names}) == 4


def test_enqueue_many_sends_unkeyed_messages_in_runs_of_one_call_to_one_shard_each(
    sharded: RedissonBroker, redis_client: redis.Redis
) -> None:
    """A batch of ``enqueue_many`` goes to the shards in runs of a call's worth (100), so a
    batch of 100 is one script call, not one per shard; keyed messages still go to their
    key's shard, and over batches every shard gets its part."""
    job = _job(redis_client)
    keyed = [job.message_with_options(args=(i,), group_key="g") for i in range(5)]
    batch = [job.message(i) for i in range(250)] + keyed
    sharded.shard_router.layout("default")  # read before the count below
    redis_client.config_resetstat()
    sharded.enqueue_many(batch)
    calls = redis_client.info("commandstats")["cmdstat_evalsha"]["calls"]
    assert calls <= 4  # 3 runs of unkeyed messages (+ the group's, when its shard has none)
    per_shard = _ready_per_shard(sharded, redis_client)
    group_shard = sharded.shard_router.key_shard("default", "g")
    unkeyed = per_shard.copy()
    unkeyed[group_shard] -= 5
    assert sorted(unkeyed.values()) == [0, 50, 100, 100]
    for _ in range(3):
        sharded.enqueue_many([job.message(i) for i in range(250)])
    assert sorted(_ready_per_shard(sharded, redis_client).values()) == [250, 250, 250, 255]


def test_one_worker_runs_every_message_once_from_every_shard_delays_and_retries_included(
    sharded: RedissonBroker, redis_client: redis.Redis
) -> None:
    job = _job(redis_client)
    for i in range(60):
        job.send(i)
    for i in range(60, 80):
        job.send_with_options(args=(i,), delay=300)
    for i in range(80, 90):
        job.send_with_options(args=(i, True))  # fails once, retried
    worker = Worker(sharded, worker_timeout=100, worker_threads=3)
    worker.start()
    try:
        assert wait_for(lambda: len(records(redis_client)) == 100, timeout=30)
        assert wait_for(
            lambda: all(redis_client.llen(sharded.keys(n).ready) == 0 for n in sharded.shard_router.consumed("default"))
        )
    finally:
        worker.stop()
    runs = Counter(r["i"] for r in records(redis_client))
    assert set(runs) == set(range(90))
    assert {i for i, n in runs.items() if n != 1} == set(range(80, 90))  # only the retried ran twice
    assert all(runs[i] == 2 for i in range(80, 90))


def test_a_queue_not_named_in_shards_keeps_its_one_set_of_keys(
    sharded: RedissonBroker, redis_client: redis.Redis
) -> None:
    @dramatiq.actor(queue_name="plain")
    def plain() -> None:
        pass

    assert sharded.shard_router.consumed("plain") == ["plain"]
    plain.send()
    assert redis_client.llen(sharded.keys("plain").ready) == 1
    assert redis_client.exists(sharded.keys("plain").shards) == 0
    sharded.flush("plain")


@pytest.mark.parametrize("shards", [{"default": 0}, {"default": 65}, {"default": 2.0}, {"bad~name": 2}, [("a", 2)]])
def test_bad_shards_are_refused_before_anything_is_made(redis_url: str, shards: Any) -> None:
    with pytest.raises(ValueError, match="shard"):
        RedissonBroker(url=redis_url, shards=shards)


def test_the_whole_queue_is_one_queue_to_stats_join_pause_and_flush(
    sharded: RedissonBroker, redis_client: redis.Redis
) -> None:
    job = _job(redis_client)
    for i in range(12):
        job.send(i)
    for i in range(12, 16):
        job.send_with_options(args=(i,), delay=60_000)
    assert sharded.known_queues() == ["default"]  # not its shards' internal names
    stats = sharded.stats()["queues"]
    assert list(stats) == ["default"]
    queue = stats["default"]
    assert (queue["ready"], queue["scheduled"]) == (12, 4)
    assert sorted(queue["shards"]) == sorted(sharded.shard_router.consumed("default"))
    assert sum(s["ready"] for s in queue["shards"].values()) == 12
    assert sharded.pending("default") == 16
    assert sharded.pause("default") and sharded.stats("default")["queues"]["default"]["paused"]
    assert sharded.resume("default") and not sharded.stats("default")["queues"]["default"]["paused"]
    sharded.flush("default")
    assert sharded.pending("default") == 0
    assert sharded.stats("default")["queues"]["default"]["ready"] == 0


def test_limits_of_a_sharded_queue_are_shared_out_over_its_shards_and_read_as_one(
    sharded: RedissonBroker, redis_client: redis.Redis
) -> None:
    sharded.declare_queue("default")
    now = sharded.limits.set("default", concurrency=10, group_concurrency=1, rate=100, per_ms=1000)
    assert (now["concurrency"], now["group_concurrency"], now["rate"], now["per_ms"]) == (10, 1, 100, 1000)
    assert now["started_in_window"] == 0 and now["in_use"] == 0
    # Each of the 4 shards: a quarter, rounded up; a group's limit whole
    for name in sharded.shard_router.consumed("default"):
        flow = redis_client.hgetall(sharded.keys(name).flow)
        assert (flow[b"concurrency"], flow[b"rate"], flow[b"group_concurrency"]) == (b"3", b"25", b"1")
    cleared = sharded.limits.clear("default")
    assert (cleared["concurrency"], cleared["rate"]) == (None, None)
    for name in sharded.shard_router.consumed("default"):
        assert redis_client.hget(sharded.keys(name).flow, "concurrency") is None


def test_growing_and_shrinking_under_a_running_worker_loses_nothing_and_runs_nothing_early(
    redis_url: str, redis_client: redis.Redis
) -> None:
    """Issue 36, changing N live: a Worker started on 2 shards consumes the shards a
    process started with 4 adds (within a safety interval); shrinking back to 2 retires
    two shards whose scheduled messages still run at their due times, and once drained
    they leave the layout and their keys are dropped. Every message runs once, none
    before its due time."""

    def broker_of(count: int) -> RedissonBroker:
        return RedissonBroker(
            url=redis_url,
            middleware=[m() for m in default_middleware],
            shards={"default": count},
            safety_interval=200,
        )

    running = broker_of(2)
    dramatiq.set_broker(running)
    job = _job(redis_client)
    worker = Worker(running, worker_timeout=100, worker_threads=4)
    worker.start()
    dues: dict[int, float] = {}

    def send(broker: RedissonBroker, i: int, delay: int) -> None:
        message = broker.enqueue(job.message_with_options(args=(i,)), delay=delay or None)
        dues[i] = float(message.options.get("eta", 0))

    grown = broker_of(4)
    shrunk: RedissonBroker | None = None
    try:
        assert len(running.shard_router.consumed("default")) == 2
        # The 2 new shards: not sent to until every consumer reads the layout again.
        assert len(grown.shard_router.layout("default").fresh) == 2
        assert wait_for(lambda: not grown.shard_router.layouts.read("default").fresh, timeout=5)  # type: ignore[union-attr]
        grown.shard_router.forget("default")
        for i in range(40):
            send(grown, i, 0 if i % 5 == 0 else 300 + 30 * i)  # over 4 shards, 2 of them new
        per_shard = grown.stats("default")["queues"]["default"]["shards"]
        assert len(per_shard) == 4 and all(s["scheduled"] for s in per_shard.values())  # the new ones too
        assert wait_for(lambda: len(records(redis_client)) == 40, timeout=20)
        # Scheduled in all 4 shards, then 2 shards retired under them.
        for i in range(40, 80):
            send(grown, i, 800 + 20 * (i - 40))
        shrunk = broker_of(2)
        layout = shrunk.shard_router.layout("default")
        assert (len(layout.active), len(layout.retired)) == (2, 2)
        retired = layout.names("default")[2:]
        assert any(redis_client.zcard(shrunk.keys(name).timeout_zset) for name in retired)
        for i in range(80, 100):
            send(shrunk, i, 200)  # only to the 2 shards left
        assert wait_for(lambda: len(records(redis_client)) == 100, timeout=30)
        # Drained: out of the layout, their keys gone, nobody consumes them.
        assert wait_for(lambda: not shrunk.shard_router.layouts.read("default").retired, timeout=10)  # type: ignore[union-attr]
        assert all(not redis_client.exists(running.keys(name).ready_msgs) for name in retired)
        assert all(not redis_client.exists(running.keys(name).timeout_zset) for name in retired)
        assert wait_for(lambda: sorted(running.known_queues()) == ["default"], timeout=5)
    finally:
        worker.stop()
        for broker in (grown, shrunk):
            if broker is not None:
                broker.close()
        running.flush_all()
        running.close()
    runs = records(redis_client)
    assert Counter(r["i"] for r in runs) == Counter(range(100))  # each once
    early = [r for r in runs if dues[r["i"]] and r["at_ms"] < dues[r["i"]]]
    assert early == []


def _limits_per_shard(broker: RedissonBroker, redis_client: redis.Redis) -> dict[str, tuple[Any, ...]]:
    """Each shard's (concurrency, group concurrency, weight of group "vip") as stored."""
    vip = "w" + b"vip".hex()
    out = {}
    for name in broker.shard_router.layouts.read("default").names("default"):  # type: ignore[union-attr]
        flow = redis_client.hgetall(broker.keys(name).flow)
        out[name] = (flow.get(b"concurrency"), flow.get(b"group_concurrency"), flow.get(vip.encode()))
    return out


def test_limits_and_weights_follow_the_shards_as_a_live_queue_grows_and_shrinks(
    redis_url: str, redis_client: redis.Redis
) -> None:
    """A shard added to a limited queue is limited like the others, and each shard's share
    follows the number of shards (retired ones count until dropped): the consumers of the
    queue reapply the limits when the layout they follow changes."""

    def broker_of(count: int) -> RedissonBroker:
        return RedissonBroker(
            url=redis_url, middleware=[m() for m in default_middleware], shards={"default": count}, safety_interval=200
        )

    running = broker_of(2)
    dramatiq.set_broker(running)
    _job(redis_client)
    worker = Worker(running, worker_timeout=100, worker_threads=2)
    worker.start()
    others: list[RedissonBroker] = []
    try:
        running.limits.set("default", concurrency=8, group_concurrency=2)
        running.limits.set_weights("default", {"vip": 3})
        assert set(_limits_per_shard(running, redis_client).values()) == {(b"4", b"2", b"3")}
        others.append(broker_of(4))
        others[0].shard_router.layout("default")
        assert wait_for(
            lambda: list(_limits_per_shard(running, redis_client).values()) == [(b"2", b"2", b"3")] * 4, timeout=5
        )
        limits = others[0].limits.get("default")
        assert (limits["concurrency"], limits["group_concurrency"]) == (8, 2)
        assert others[0].limits.weights("default") == {"vip": 3}
        # Every shard has them now: reapplying again reads and writes nothing.
        names = others[0].shard_router.layouts.read("default").names("default")  # type: ignore[union-attr]
        assert running.limits.reapply("default", names) == 0
        # Shrunk to 2: the 2 retired shards hold nothing, are dropped, and the 2 left get half each.
        others.append(broker_of(2))
        assert len(others[1].shard_router.layout("default").retired) == 2
        assert wait_for(
            lambda: list(_limits_per_shard(running, redis_client).values()) == [(b"4", b"2", b"3")] * 2, timeout=10
        )
    finally:
        worker.stop()
        for broker in others:
            broker.close()
        running.flush_all()
        running.close()


def test_a_queue_limited_before_it_had_shards_keeps_its_limits_over_them(
    redis_url: str, redis_client: redis.Redis
) -> None:
    plain = RedissonBroker(url=redis_url, middleware=[m() for m in default_middleware])
    plain.declare_queue("default")
    plain.limits.set("default", concurrency=6, rate=30, per_ms=1000)
    plain.limits.set_weights("default", {"vip": 2})
    sharded = RedissonBroker(url=redis_url, middleware=[m() for m in default_middleware], shards={"default": 3})
    try:
        sharded.declare_queue("default")  # (a queue must be known to be operated)
        consumer = sharded.consume("default")
        flows = [redis_client.hgetall(sharded.keys(n).flow) for n in sharded.shard_router.consumed("default")]
        assert [(f[b"concurrency"], f[b"rate"], f[b"w" + b"vip".hex().encode()]) for f in flows] == [
            (b"2", b"10", b"2")
        ] * 3
        limits = sharded.limits.get("default")
        assert (limits["concurrency"], limits["rate"], limits["per_ms"]) == (6, 30, 1000)
        consumer.close()
    finally:
        sharded.flush_all()
        sharded.close()
        plain.close()


def test_a_periodic_actor_on_a_sharded_queue_ticks_once_per_tick_from_shard_0(
    redis_url: str, redis_client: redis.Redis
) -> None:
    """Two worker processes on a queue over 3 shards, each declaring a schedule every
    0.5 s: every tick runs exactly once, never early; the schedule and its chain live in
    shard 0 (the queue's own keys), the other shards hold none of it."""
    with worker_processes(
        redis_url, redis_client, 2, env={"PERIODIC_EVERY_S": "0.5", "SHARDS": "default=3", "THREADS": "2"}
    ):
        time.sleep(4.2)
        broker = RedissonBroker(url=redis_url, shards={"default": 3})
        shards = broker.shard_router.consumed("default")
        chained = [name for name in shards if redis_client.hlen(broker.keys(name).chains)]
    ran = [r for r in records(redis_client) if "tick" in r]
    counts = Counter(r["tick"] for r in ran)
    assert counts and all(n == 1 for n in counts.values()), counts
    ticks = sorted(counts)
    assert len(ticks) >= 6 and all(b - a == 500 for a, b in zip(ticks, ticks[1:], strict=False)), ticks
    assert all(r["at_ms"] >= r["tick"] for r in ran), "a tick ran early"
    assert len(shards) == 3 and chained == ["default"]
    (info,) = [s for s in broker.schedules.list() if s.name == "every-second"]
    assert info.queue_name == "default"
    broker.schedules.remove("every-second")
    broker.flush_all()
    broker.close()


def test_across_shards_a_message_due_earlier_runs_no_later_than_the_lateness_bound_after_one_due_later(
    sharded: RedissonBroker, redis_client: redis.Redis
) -> None:
    """The ordering promise over shards (README, "Scaling out"): each shard keeps due order;
    across shards, a message due earlier starts at most the shards' lateness after one due
    later. Measured tails are the benchmarks' business; this bound (1 s) only catches a
    shard that stalls behind the others."""
    job = _job(redis_client)
    dues: dict[int, float] = {}
    for i in range(120):
        message = job.send_with_options(args=(i,), delay=400 + 10 * (i * 37 % 120))
        dues[i] = float(message.options["eta"])
    worker = Worker(sharded, worker_timeout=100, worker_threads=4)
    worker.start()
    try:
        assert wait_for(lambda: len(records(redis_client)) == 120, timeout=30)
    finally:
        worker.stop()
    started = {r["i"]: r["at_ms"] for r in records(redis_client)}
    by_due = sorted(dues, key=dues.__getitem__)
    # The worst inversion: how long after a message due later one due earlier started.
    earliest_later = float("inf")
    worst = 0.0
    for i in reversed(by_due):
        worst = max(worst, started[i] - earliest_later)
        earliest_later = min(earliest_later, started[i])
    assert worst < 1000, f"a message due earlier started {worst:.0f} ms after one due later"
    assert all(started[i] >= dues[i] for i in dues), "a message ran early"


def test_the_router_keeps_the_layout_it_knows_while_its_server_is_away() -> None:
    """The layout is read again every safety_interval; while the server that holds it
    (shard 0's, on a cluster) cannot be reached, sends keep going to the shards known
    instead of failing before a shard is chosen (on a cluster the other shards' masters
    still take them: tests/sharding/test_cluster_shards_faults.py)."""
    with embedded_redis_url(env_var="_DRAMATIQ_REDISSON_NEVER_SET") as url:  # a server of its own
        broker = RedissonBroker(url=url, shards={"default": 3}, safety_interval=1)
        names = broker.shard_router.consumed("default")
        assert len(names) == 3
    try:  # the server is stopped now
        time.sleep(0.01)  # past the safety interval: the next send reads the layout again
        assert {broker.shard_router.target("default", {}) for _ in range(6)} == set(names)
        with pytest.raises(redis.ConnectionError):
            broker.pending("default")  # a call to the server itself fails
    finally:
        broker.close()
