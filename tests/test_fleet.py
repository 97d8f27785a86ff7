"""Fleet cost: one consumer per queue runs the transfers (a lease), and a ready message
wakes one idle consumer, not all of them. Several consumers of one queue, each of its
own broker (as separate worker processes would have), driven by threads the way
Dramatiq's consumer threads drive them."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import dramatiq
import pytest
import redis

from dramatiq_redisson import RedissonBroker
from dramatiq_redisson._consumer import RedissonConsumer
from tests.harness.faults.procs import token_pid
from tests.helpers import server_ms, wait_for


class Driven:
    """One consumer on a thread: runs each message (records it) and acks it, counting the
    transfer and fetch calls its broker makes. ``stop(close=False)`` abandons the
    consumer as a killed process would (no close, no release)."""

    def __init__(
        self, broker: RedissonBroker, run: Callable[[Any], None], prefetch: int, timeout: int, start: bool
    ) -> None:
        self.broker = broker
        self.calls: Counter[str] = Counter()
        scripts = broker.redisson_scripts
        for name in ("transfer", "fetch"):
            original = getattr(scripts, name)

            def counted(*args: Any, _name: str = name, _original: Any = original, **kwargs: Any) -> Any:
                self.calls[_name] += 1
                return _original(*args, **kwargs)

            setattr(scripts, name, counted)
        self.consumer: RedissonConsumer = broker.consume("default", prefetch=prefetch, timeout=timeout)  # type: ignore[assignment]
        self.run = run
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        if start:
            self.start()

    def start(self) -> None:
        self.thread.start()

    def _loop(self) -> None:
        while not self.stopping.is_set():
            message = next(self.consumer)
            if message is not None:
                self.run(message)
                self.consumer.ack(message)

    @property
    def owner(self) -> bool:
        return self.consumer.timer.owner

    def stop(self, close: bool = True) -> None:
        self.stopping.set()
        if self.thread.is_alive():
            self.thread.join(5)
        if close:
            self.consumer.close()


@pytest.fixture
def fleet(redis_url: str, redis_client: redis.Redis) -> Iterator[Callable[..., list[Driven]]]:
    made: list[Driven] = []

    def start(n: int, *, prefetch: int = 1, timeout: int = 1000, start: bool = True, **options: Any) -> list[Driven]:
        def run(message: Any) -> None:
            redis_client.rpush("test:runs", f"{message.kwargs.get('i')} {server_ms(redis_client)}")

        for _ in range(n):
            broker = RedissonBroker(url=redis_url, **options)
            broker.declare_queue("default")
            made.append(Driven(broker, run, prefetch, timeout, start))
        return made[-n:]

    yield start
    for driven in made:
        if not driven.stopping.is_set():
            driven.stop()
        driven.broker.close()


@pytest.fixture
def job(broker: RedissonBroker) -> Any:
    """An actor on the default queue whose runs the driven consumers record."""

    @dramatiq.actor
    def job(i: int) -> None: ...

    return job


def runs(client: redis.Redis) -> dict[int, list[int]]:
    """Message ``i`` -> its run times (server epoch ms)."""
    out: dict[int, list[int]] = {}
    for raw in client.lrange("test:runs", 0, -1):
        i, at = raw.decode().split()
        out.setdefault(int(i), []).append(int(at))
    return out


def owner_of(fleet: list[Driven]) -> Driven:
    assert wait_for(lambda: sum(d.owner for d in fleet) == 1, timeout=5), [d.owner for d in fleet]
    return next(d for d in fleet if d.owner)


def test_one_consumer_transfers_for_the_fleet_and_a_message_wakes_one_consumer(
    broker: RedissonBroker, job: Any, redis_client: redis.Redis, fleet: Callable[..., list[Driven]]
) -> None:
    # Given four idle consumers of one queue (four worker processes)
    consumers = fleet(4, transfer_lease=1000)
    owner = owner_of(consumers)
    keys = broker.keys("default")
    assert wait_for(lambda: redis_client.zcard(keys.idle) == 4)
    # Only the lease holder listens for due-time announcements.
    assert redis_client.pubsub_numsub(keys.channel)[0][1] == 1
    assert redis_client.get(keys.lease).decode().startswith(owner.consumer.token + " ")
    for d in consumers:
        d.calls.clear()

    # When 20 delayed and 20 immediate messages come, one every 25 ms
    started = time.monotonic()
    for i in range(20):
        job.send_with_options(kwargs={"i": i}, delay=200 + 25 * i)
    for i in range(20, 40):
        job.send_with_options(kwargs={"i": i})
        time.sleep(0.025)
    assert wait_for(lambda: len(runs(redis_client)) == 40, timeout=10)
    elapsed = time.monotonic() - started

    # Then each ran once, on time
    assert all(len(times) == 1 for times in runs(redis_client).values())
    # The owner ran (about) one transfer per due time; each standby only checked the lease,
    # about once per lease, whatever the number of messages (before: one transfer per
    # consumer per due time, 20+ each).
    assert owner.calls["transfer"] >= 15
    for d in consumers:
        if d is not owner:
            assert d.calls["transfer"] <= elapsed / 0.9 + 2, (d.calls, elapsed)
    # A message woke one consumer: about two fetches per message (the woken fetch, and the
    # one after the ack that registers the consumer as idle again), not one per consumer
    # per message plus back-off polling.
    fetches = sum(d.calls["fetch"] for d in consumers)
    assert fetches <= 2.5 * 40 + 8, [d.calls for d in consumers]


def test_a_killed_owner_delays_transfers_by_at_most_about_one_lease(
    broker: RedissonBroker, job: Any, redis_client: redis.Redis, fleet: Callable[..., list[Driven]]
) -> None:
    consumers = fleet(3, transfer_lease=1000)
    owner = owner_of(consumers)
    # When the owner stops without a word (kill -9: its lease stays until it lapses)
    owner.stop(close=False)
    sent_at = server_ms(redis_client)
    job.send_with_options(kwargs={"i": 1}, delay=100)
    # Then another consumer takes the lease over and runs it within the lease (+ jitter)
    assert wait_for(lambda: 1 in runs(redis_client), timeout=5)
    lateness = runs(redis_client)[1][0] - (sent_at + 100)
    assert lateness <= 1000 + 300, lateness
    assert sum(d.owner for d in consumers if d is not owner) == 1


def test_a_closing_owner_hands_the_lease_over_at_once(
    broker: RedissonBroker, job: Any, redis_client: redis.Redis, fleet: Callable[..., list[Driven]]
) -> None:
    # Given a lease far longer than the wait below
    consumers = fleet(3, transfer_lease=20_000)
    owner = owner_of(consumers)
    # When the owner shuts down cleanly
    owner.stop()
    due = server_ms(redis_client) + 200
    job.send_with_options(kwargs={"i": 1}, delay=200)
    # Then a successor took the lease right away and the message runs on time
    assert wait_for(lambda: 1 in runs(redis_client), timeout=3)
    assert runs(redis_client)[1][0] - due <= 150
    assert sum(d.owner for d in consumers if d is not owner) == 1


def test_a_stale_idle_entry_never_swallows_a_wake_up(
    broker: RedissonBroker, job: Any, redis_client: redis.Redis, fleet: Callable[..., list[Driven]]
) -> None:
    (consumer,) = fleet(1)
    keys = broker.keys("default")
    assert wait_for(lambda: redis_client.zscore(keys.idle, consumer.consumer.token) is not None)
    # Given a consumer that died while registered idle, with more free slots than anyone
    redis_client.zadd(keys.idle, {"ghost:1:dead:1": 100})
    # When a message comes
    sent_at = server_ms(redis_client)
    job.send_with_options(kwargs={"i": 1})
    # Then the live consumer is woken (no poll: its next poll is up to 1 s away) and the
    # ghost is gone
    assert wait_for(lambda: 1 in runs(redis_client), timeout=3)
    assert runs(redis_client)[1][0] - sent_at <= 200
    assert redis_client.zscore(keys.idle, "ghost:1:dead:1") is None


def test_messages_a_closing_consumer_gives_back_wake_an_idle_one(
    broker: RedissonBroker, job: Any, redis_client: redis.Redis, fleet: Callable[..., list[Driven]]
) -> None:
    # Given a consumer holding two prefetched messages, one of them not started
    (idle,) = fleet(1, start=False)
    holder = broker.consume("default", prefetch=2, timeout=100)
    job.send_with_options(kwargs={"i": 1})
    job.send_with_options(kwargs={"i": 2})
    first = next(holder) or next(holder)
    assert first is not None and len(holder.message_cache) == 1  # type: ignore[attr-defined]
    # and another consumer, idle and registered (its next poll is up to 1 s away)
    idle.start()
    keys = broker.keys("default")
    assert wait_for(lambda: redis_client.zscore(keys.idle, idle.consumer.token) is not None)
    # When the holder shuts down, giving both back
    closed_at = server_ms(redis_client)
    holder.requeue([first])
    holder.close()
    # Then the idle consumer is woken and runs them at once
    assert wait_for(lambda: {1, 2} <= set(runs(redis_client)), timeout=3)
    assert max(t for times in runs(redis_client).values() for t in times) - closed_at <= 200


def test_consumer_tokens_name_their_process() -> None:
    broker_id = "0f5c2d8e-1111-2222-3333-444455556666"
    from dramatiq_redisson._consumer import consumer_token

    a, b = consumer_token(broker_id), consumer_token(broker_id)
    assert a != b
    import os

    assert token_pid(a) == os.getpid()
    assert not set(" {}") & set(a)
    assert token_pid("no-pid") is None


@pytest.mark.parametrize("lease", [0, 99, 1.5, "2000"])
def test_transfer_lease_is_validated(redis_url: str, lease: Any) -> None:
    with pytest.raises(ValueError, match="transfer_lease"):
        RedissonBroker(url=redis_url, transfer_lease=lease)


def test_the_transfer_script_takes_renews_and_respects_the_lease(
    broker: RedissonBroker, redis_client: redis.Redis
) -> None:
    keys = broker.keys("default")
    scripts = broker.redisson_scripts

    def transfer(token: str) -> Any:
        return scripts.transfer(
            keys, limit=10, trim_budget=10, compact_step=10, compact_slack=10, token=token, lease_ms=3000
        )

    # The first caller takes the lease; a second caller stands by until it ends
    first = transfer("a:1:x:1")
    assert first.owner
    value = redis_client.get(keys.lease)
    assert value is not None
    holder, end = value.decode().split()
    assert holder == "a:1:x:1" and abs(int(end) - first.server_now_us // 1000 - 3000) <= 1
    other = transfer("b:2:y:1")
    assert not other.owner and other.lease_until_ms == int(end)
    # The holder's calls within a third of the lease do not rewrite it (no write per due time)
    assert transfer("a:1:x:1").owner
    assert redis_client.get(keys.lease) == value
    assert 2000 < redis_client.pttl(keys.lease) <= 3000
    # Both are registered as seen; a call without a token ignores the lease
    assert set(redis_client.zrange(keys.consumers, 0, -1)) == {b"a:1:x:1", b"b:2:y:1"}
    assert scripts.transfer(keys, limit=10, trim_budget=10, compact_step=10, compact_slack=10).owner
    assert redis_client.get(keys.lease) == value


def test_the_transfer_hands_due_messages_to_its_caller_only_when_nothing_waits_ahead(
    broker: RedissonBroker, job: Any, redis_client: redis.Redis
) -> None:
    keys = broker.keys("default")

    def transfer(own_slots: int) -> Any:
        return broker.redisson_scripts.transfer(
            keys,
            limit=10,
            trim_budget=10,
            compact_step=10,
            compact_slack=10,
            token="a:1:x:1",
            lease_ms=3000,
            own_slots=own_slots,
            worker_id="w1",
            listening=True,
        )

    # An empty ready queue: the due message goes straight to the caller's ack set, and a
    # caller with a slot left over is registered as idle with it
    job.send_with_options(kwargs={"i": 1}, delay=1)
    time.sleep(0.01)
    result = transfer(own_slots=2)
    assert result.moved == 1 and result.registered
    ((member, data),) = result.fetched
    assert data is not None and b'"i":1' in data
    assert redis_client.smembers(keys.acks("w1")) == {member.encode()}
    assert redis_client.llen(keys.ready) == 0 and redis_client.hexists(keys.ready_msgs, member)
    assert redis_client.zscore(keys.idle, "a:1:x:1") == 1
    # Messages already waiting: what comes due queues behind them (FIFO); the caller fetches
    job.send_with_options(kwargs={"i": 2})
    job.send_with_options(kwargs={"i": 3}, delay=1)
    time.sleep(0.01)
    result = transfer(own_slots=2)
    assert result.moved == 1 and result.fetched == [] and not result.registered
    assert redis_client.llen(keys.ready) == 2
    assert redis_client.zscore(keys.idle, "a:1:x:1") is None
