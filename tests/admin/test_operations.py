"""Operators' API on the real server: scan, bulk promote/remove, dead letters, stats,
the queue registry and the transfer listeners."""

from __future__ import annotations

import os
import time
from collections import Counter
from typing import Any

import dramatiq
import pytest
import redis
from dramatiq import Actor, Worker

from dramatiq_redisson import RedissonBroker
from dramatiq_redisson.admin import _delayed_queue as delayed_queue_module
from tests.helpers import record, records, server_ms, wait_for


def _schedule(actor: Actor[..., None], ids: range, delay: int, tag: str = "") -> list[str]:
    return [actor.send_with_options(args=(i,), kwargs={"tag": tag}, delay=delay).message_id for i in ids]


# -- scan ---------------------------------------------------------------------------


def test_scan_yields_everything_in_due_order_page_by_page(
    broker: RedissonBroker, actors: tuple[Actor[..., None], Actor[..., None]]
) -> None:
    alpha, beta = actors
    dq = broker.delayed_queue("default")
    # Given messages with distinct due times, sent out of due order, and a run of equal ones
    for i in range(30):
        (alpha if i % 2 else beta).send_with_options(args=(i,), delay=600_000 + ((i * 7) % 30) * 1000)
    same = broker.enqueue_many([alpha.message(100 + i) for i in range(25)], delay=3_600_000)
    # When scanning with pages of 4
    scanned = list(dq.scan(batch=4))
    # Then every message comes once, in due order, equal due times in offer order
    assert len(scanned) == 55
    dues = [due for due, _ in scanned]
    assert dues == sorted(dues)
    assert [m.message_id for _, m in scanned[-25:]] == [m.message_id for m in same]
    assert Counter(m.message_id for _, m in scanned).most_common(1)[0][1] == 1
    # And the due times are the stored ones, the messages decode with their redis id
    assert scanned == dq.read_all()
    due, message = scanned[0]
    assert (due, message.message_id) == (dq.get(message.message_id)[0], message.message_id)  # type: ignore[index]


def test_scan_filters_by_actor_and_substring(
    broker: RedissonBroker, actors: tuple[Actor[..., None], Actor[..., None]]
) -> None:
    alpha, beta = actors
    _schedule(alpha, range(10), 600_000, tag="invoice-7")
    _schedule(beta, range(10, 20), 600_000, tag="invoice-7")
    _schedule(alpha, range(20, 30), 600_000, tag="invoice-8")
    dq = broker.delayed_queue("default")
    assert {m.args[0] for _, m in dq.scan(actor_name="alpha", batch=3)} == set(range(10)) | set(range(20, 30))
    assert {m.args[0] for _, m in dq.scan(match="invoice-7", batch=3)} == set(range(20))
    assert {m.args[0] for _, m in dq.scan(actor_name="beta", match=b"invoice-7")} == set(range(10, 20))
    # An actor name that only appears inside the arguments does not count as that actor
    _schedule(alpha, range(30, 31), 600_000, tag="beta")
    assert {m.args[0] for _, m in dq.scan(actor_name="beta")} == set(range(10, 20))
    assert list(dq.scan(actor_name="nobody")) == []
    with pytest.raises(ValueError):
        list(dq.scan(batch=0))


def test_scan_goes_on_when_the_entry_it_stopped_at_is_gone(
    broker: RedissonBroker, actors: tuple[Actor[..., None], Actor[..., None]]
) -> None:
    alpha, _ = actors
    dq = broker.delayed_queue("default")
    # Given many messages with one due time (a bulk send) and a few later ones
    bulk = broker.enqueue_many([alpha.message(i) for i in range(40)], delay=600_000)
    later = _schedule(alpha, range(40, 45), 700_000)
    seen: list[str] = []
    # When the last entry of each page (the scan's cursor) is removed before the next
    # page is read, while the entries of the same due time before it stay
    for n, (_, message) in enumerate(dq.scan(batch=5)):
        seen.append(message.message_id)
        if n % 5 == 4:
            assert dq.remove(message.message_id)
    # Then the scan still saw each once, in order
    assert seen == [m.message_id for m in bulk] + later
    assert dq.size() == 45 - 9


def test_scan_of_an_empty_queue(broker: RedissonBroker) -> None:
    broker.declare_queue("default")
    assert list(broker.delayed_queue("default").scan()) == []


# -- bulk promote / remove ----------------------------------------------------------


def test_promote_all_of_one_actor_runs_them_now_and_leaves_the_others(
    broker: RedissonBroker,
    redis_client: redis.Redis,
    worker: Worker,
    actors: tuple[Actor[..., None], Actor[..., None]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    alpha, beta = actors
    monkeypatch.setattr(delayed_queue_module, "BULK_STEP", 7)  # several server steps
    _schedule(alpha, range(20), 600_000)
    _schedule(beta, range(20, 40), 600_000)
    dq = broker.delayed_queue("default")
    started = server_ms(redis_client)
    assert dq.promote_all(actor_name="alpha") == 20
    assert wait_for(lambda: len(records(redis_client)) == 20, timeout=5)
    time.sleep(0.3)
    runs = records(redis_client)
    assert sorted(r["i"] for r in runs) == list(range(20))
    assert max(r["at_ms"] for r in runs) - started < 1000
    assert dq.size() == 20 and {m.actor_name for _, m in dq.scan()} == {"beta"}


def test_promote_all_with_a_limit_takes_the_earliest(
    broker: RedissonBroker,
    redis_client: redis.Redis,
    worker: Worker,
    actors: tuple[Actor[..., None], Actor[..., None]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    alpha, _ = actors
    monkeypatch.setattr(delayed_queue_module, "BULK_STEP", 4)
    for i in range(10):
        alpha.send_with_options(args=(i,), delay=600_000 + i * 1000)
    dq = broker.delayed_queue("default")
    assert dq.promote_all(limit=6) == 6
    assert wait_for(lambda: len(records(redis_client)) == 6, timeout=5)
    assert sorted(r["i"] for r in records(redis_client)) == list(range(6))
    assert dq.promote_all(limit=0) == 0
    assert dq.promote_all() == 4
    assert wait_for(lambda: len(records(redis_client)) == 10, timeout=5)
    assert dq.promote_all() == 0


def test_remove_all_by_actor_and_everything(
    broker: RedissonBroker, actors: tuple[Actor[..., None], Actor[..., None]], monkeypatch: pytest.MonkeyPatch
) -> None:
    alpha, beta = actors
    monkeypatch.setattr(delayed_queue_module, "BULK_STEP", 6)
    _schedule(alpha, range(15), 600_000)
    kept = _schedule(beta, range(15, 30), 600_000)
    dq = broker.delayed_queue("default")
    assert dq.remove_all(actor_name="alpha", limit=5) == 5
    assert dq.remove_all(actor_name="alpha") == 10
    assert sorted(m.message_id for _, m in dq.scan()) == sorted(kept)
    assert dq.remove_all(limit=3) == 3
    assert dq.remove_all() == 12
    assert dq.size() == 0
    assert broker.client.hlen(broker.keys("default").payloads) == 0
    with pytest.raises(ValueError):
        dq.remove_all(limit=-1)


# -- dead letters -------------------------------------------------------------------


@pytest.fixture
def failing(broker: RedissonBroker, redis_client: redis.Redis) -> Actor[..., None]:
    """An actor that fails (no retries) unless the ``test:heal`` key is set."""

    @dramatiq.actor(max_retries=0)
    def fragile(i: int) -> None:
        record(redis_client, i=i)
        if not redis_client.exists("test:heal"):
            raise RuntimeError("broken")

    return fragile


def test_dead_letters_can_be_read_requeued_once_and_removed(
    broker: RedissonBroker, redis_client: redis.Redis, worker: Worker, failing: Actor[..., None]
) -> None:
    dead = broker.dead_letters("default")
    # Given five messages that died
    for i in range(5):
        failing.send(i)
    assert wait_for(lambda: dead.size() == 5, timeout=5)
    letters = dead.read_all()
    assert sorted(m.args[0] for _, m in letters) == list(range(5))
    assert [died for died, _ in letters] == sorted(died for died, _ in letters)
    assert dead.read_all(limit=2) == letters[:2]
    first = letters[0][1].options["redis_message_id"]
    assert dead.get(first) == letters[0]
    assert dead.get("no-such-id") is None
    # When the cause is fixed and one is requeued, twice
    redis_client.set("test:heal", 1)
    assert dead.requeue(first)
    assert not dead.requeue(first)
    # Then it runs once, and is no longer dead
    assert wait_for(lambda: len(records(redis_client)) == 6, timeout=5)
    time.sleep(0.3)
    assert [r["i"] for r in records(redis_client)].count(letters[0][1].args[0]) == 2
    assert dead.size() == 4
    # When one is removed and the rest requeued in bulk
    assert dead.remove(letters[1][1].options["redis_message_id"])
    assert not dead.remove(letters[1][1].options["redis_message_id"])
    assert dead.requeue_all() == 3
    assert wait_for(lambda: len(records(redis_client)) == 9, timeout=5)
    time.sleep(0.3)
    assert len(records(redis_client)) == 9
    assert dead.size() == 0 and broker.pending("default") == 0


def test_a_dead_letter_keeps_the_final_traceback_and_retry_count(
    broker: RedissonBroker, redis_client: redis.Redis, worker: Worker
) -> None:
    @dramatiq.actor(max_retries=1, min_backoff=10, max_backoff=10)
    def doomed(i: int) -> None:
        raise ValueError(f"attempt failed for {i}")

    # Given a message that fails its first run and its one retry
    doomed.send(7)
    dead = broker.dead_letters("default")
    assert wait_for(lambda: dead.size() == 1, timeout=10)
    # Then its dead letter is the message as it failed for good, not as it was first sent
    ((_, letter),) = dead.read_all()
    assert letter.options["retries"] == 2
    assert "ValueError: attempt failed for 7" in letter.options["traceback"]
    assert dead.get(letter.options["redis_message_id"]) is not None
    # And a requeue still runs it (and it dies again, with its count kept)
    assert dead.requeue(letter.options["redis_message_id"])
    assert wait_for(lambda: dead.size() == 1 and dead.read_all()[0][1].options["retries"] == 3, timeout=10)


def test_dead_letters_bulk_in_steps(
    broker: RedissonBroker, redis_client: redis.Redis, failing: Actor[..., None], monkeypatch: pytest.MonkeyPatch
) -> None:
    from dramatiq_redisson.admin import _dead_letters

    monkeypatch.setattr(_dead_letters, "BULK_STEP", 3)
    worker = Worker(broker, worker_timeout=100, worker_threads=2)
    worker.start()
    try:
        for i in range(10):
            failing.send(i)
        dead = broker.dead_letters("default")
        assert wait_for(lambda: dead.size() == 10, timeout=5)
    finally:
        worker.stop()
    # Requeued with no consumer running: they wait in the ready queue, once each
    assert dead.requeue_all(limit=4) == 4
    assert broker.client.llen(broker.keys("default").ready) == 4
    assert dead.clear() == 6
    assert dead.size() == 0 and dead.clear() == 0
    assert len(dead) == 0


def test_a_requeued_dead_letter_still_queued_is_not_pushed_twice(
    broker: RedissonBroker, redis_client: redis.Redis, stamp: Actor[[int | None], None]
) -> None:
    keys = broker.keys("default")
    message = stamp.send(1)
    rid = message.options["redis_message_id"]
    # Given a dead letter whose redis id is also still queued (an operator copied it)
    redis_client.zadd(keys.xq, {rid: 1})
    redis_client.hset(keys.xq_msgs, rid, message.encode())
    # When it is requeued, it leaves the dead letters but is queued once
    assert broker.dead_letters("default").requeue(rid)
    assert redis_client.lrange(keys.ready, 0, -1) == [rid.encode()]
    assert redis_client.zcard(keys.xq) == 0


# -- stats --------------------------------------------------------------------------


def test_stats_count_every_state_of_a_queue(
    broker: RedissonBroker, redis_client: redis.Redis, actors: tuple[Actor[..., None], Actor[..., None]]
) -> None:
    alpha, _ = actors
    keys = broker.keys("default")
    # Nothing consumes: ready messages wait, scheduled ones stay scheduled
    for i in range(3):
        alpha.send(i)
    _schedule(alpha, range(3, 7), 600_000)
    overdue = alpha.send_with_options(args=(9,), delay=1)
    redis_client.zadd(keys.timeout_zset, {overdue.options["redis_message_id"]: server_ms(redis_client) - 5000})
    redis_client.zadd(keys.xq, {"gone": 1})
    # One message in flight: fetched into an ack set
    broker.redisson_scripts.fetch(keys, "some-worker", 1)
    stats = broker.stats()
    now = server_ms(redis_client)
    assert abs(stats["time_ms"] - now) < 1000
    assert stats["workers"] == 1  # the fetch above heartbeat as "some-worker"
    q = stats["queues"]["default"]
    assert q["ready"] == 2 and q["in_flight"] == 1
    assert q["scheduled"] == 5 and q["overdue"] == 1
    assert q["next_due_ms"] is not None and q["next_due_ms"] < now - 4000
    assert q["dead"] == 1 and q["legacy_delayed"] == 0
    assert q["consumers"] == 0 and q["transfer_holder"] is None
    again = broker.stats("default")["queues"]
    # (the same counts; the latency grew meanwhile: the two ready messages still wait)
    assert again["default"].pop("latency_ms") >= q.pop("latency_ms") > 0
    assert again == {"default": q}
    assert broker.stats(overdue_grace=10_000)["queues"]["default"]["overdue"] == 0
    with pytest.raises(ValueError):
        broker.stats(overdue_grace=-1)


def test_stats_of_a_running_fleet_and_the_queue_registry(
    broker: RedissonBroker,
    redis_url: str,
    redis_client: redis.Redis,
    make_broker: Any,
    stamp: Actor[[int | None], None],
) -> None:
    worker = Worker(broker, worker_timeout=100, worker_threads=2)
    worker.start()
    try:
        stamp.send(1)
        assert wait_for(lambda: len(records(redis_client)) == 1)
        assert wait_for(lambda: broker.stats()["queues"]["default"]["transfer_holder"] is not None, timeout=5)
        # The actor's record is written before the worker acks, so the ack may still be on its way
        assert wait_for(lambda: broker.stats()["queues"]["default"]["in_flight"] == 0, timeout=5)
        q = broker.stats()["queues"]["default"]
        assert q["consumers"] == 1 and q["ready"] == 0 and q["in_flight"] == 0
        assert q["transfer_holder"].split(":")[1] == str(os.getpid())
        # A broker that declared nothing finds the consumed queue in the registry
        other = make_broker(url=redis_url)
        assert wait_for(lambda: "default" in other.known_queues(), timeout=5)
        assert list(other.stats()["queues"]) == ["default"]
        assert other.stats()["workers"] == 1
    finally:
        worker.stop()
    # A queue nobody declared, sent to or consumed is refused, not read as an empty one
    with pytest.raises(ValueError, match="unknown queue 'nothing-here'.*known: default"):
        broker.stats("nothing-here")


# -- transfer listeners -------------------------------------------------------------


def test_transfer_listeners_get_each_moved_message_lateness(
    broker: RedissonBroker, redis_client: redis.Redis, worker: Worker, stamp: Actor[[int | None], None]
) -> None:
    seen: list[tuple[str, list[int]]] = []
    broker.transfer_listeners.append(lambda queue, lateness: seen.append((queue, lateness)))
    broker.transfer_listeners.append(lambda queue, lateness: 1 / 0)  # a broken one is logged only
    keys = broker.keys("default")
    for i in range(5):
        stamp.send_with_options(args=(i,), delay=300)
    # Two messages already 2 s overdue when the transfer finds them
    late = [stamp.send_with_options(args=(i,), delay=60_000) for i in (5, 6)]
    for message in late:
        redis_client.zadd(keys.timeout_zset, {message.options["redis_message_id"]: server_ms(redis_client) - 2000})
    redis_client.publish(keys.channel, "0")
    assert wait_for(lambda: len(records(redis_client)) == 7, timeout=5)
    lateness = [late_ms for queue, batch in seen for late_ms in batch]
    assert {queue for queue, _ in seen} == {"default"}
    assert len(lateness) == 7
    assert sorted(lateness)[-2] >= 2000 and sorted(lateness)[-1] < 3000
    assert all(0 <= late_ms < 100 for late_ms in sorted(lateness)[:5])


def test_a_queue_nobody_consumes_is_listed_by_its_first_send(
    broker: RedissonBroker, redis_url: str, make_broker: Any, redis_client: redis.Redis
) -> None:
    # Given a producer that sends to a queue no worker consumes (the "stuck" case)
    @dramatiq.actor(queue_name="orphans")
    def orphan() -> None: ...

    message = orphan.send_with_options(delay=60_000)
    keys = broker.keys("orphans")
    redis_client.zadd(keys.timeout_zset, {message.options["redis_message_id"]: server_ms(redis_client) - 5000})
    broker.enqueue_many([orphan.message()], delay=None)
    # Then a broker in another process (one that declared nothing) sees it, and its overdue message
    other = make_broker(url=redis_url)
    assert other.known_queues() == ["orphans"]
    q = other.stats()["queues"]["orphans"]
    assert (q["scheduled"], q["overdue"], q["ready"], q["consumers"]) == (1, 1, 1, 0)
    # Listing costs one command per queue and process, not one per send
    assert redis_client.smembers(keys.registry) == {b"orphans"}
    assert broker.producer.registered == {"orphans"}
