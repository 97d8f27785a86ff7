"""join / flush, migration from the built-in broker, dead workers, backup-list upkeep."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import dramatiq
import pytest
import redis
from dramatiq import Actor, Worker
from dramatiq.brokers.redis import RedisBroker
from dramatiq.errors import QueueJoinTimeout

from dramatiq_redisson import RedissonBroker
from dramatiq_redisson._tuning import COMPACT_SLACK, COMPACT_STEP, TRIM_BUDGET, UPKEEP_INTERVAL_MS
from tests.helpers import record, records, server_ms, wait_for

ZSET = "redisson_delay_queue_timeout:{dramatiq:default}"
BACKUP = "redisson_delay_queue:{dramatiq:default}"
CURSOR = "redisson_delay_queue_cursor:{dramatiq:default}"


def test_join_waits_for_scheduled_messages(
    broker: RedissonBroker, worker: Worker, redis_client: redis.Redis, stamp: Actor[[int | None], None]
) -> None:
    stamp.send_with_options(delay=600)
    with pytest.raises(QueueJoinTimeout):
        broker.join("default", timeout=200)
    broker.join("default", timeout=5_000)
    assert len(records(redis_client)) == 1


def test_flush_and_flush_all_delete_the_delayed_structures(broker: RedissonBroker, redis_client: redis.Redis) -> None:
    @dramatiq.actor(queue_name="one")
    def one() -> None: ...

    @dramatiq.actor(queue_name="two")
    def two() -> None: ...

    for actor in (one, two):
        actor.send()
        actor.send_with_options(delay=60_000)
    broker.flush("one")
    assert not any(b"one" in key for key in redis_client.keys("*"))
    assert (
        redis_client.exists("redisson_delay_queue_timeout:{dramatiq:two}", "redisson_delay_queue:{dramatiq:two}") == 2
    )
    broker.flush_all()
    assert redis_client.keys("*") == []


def test_consumer_migrates_builtin_delay_queue_at_original_eta(
    broker: RedissonBroker, redis_url: str, redis_client: redis.Redis, make_broker: Callable[..., Any]
) -> None:
    # Given messages a built-in broker left in <queue>.DQ (one due soon, one far away)
    builtin = make_broker(RedisBroker, url=redis_url)

    @dramatiq.actor(broker=builtin, actor_name="stamp")
    def old_stamp(i: int) -> None: ...

    soon = old_stamp.send_with_options(args=(1,), delay=500)
    later = old_stamp.send_with_options(args=(2,), delay=3_600_000)
    assert redis_client.llen("dramatiq:default.DQ") == 2

    # When the deployment switches to RedissonBroker and a worker starts
    @dramatiq.actor(broker=broker, actor_name="stamp")
    def stamp(i: int) -> None:
        record(redis_client, i=i)

    worker = Worker(broker, worker_timeout=100)
    worker.start()
    try:
        # Then the .DQ is emptied into the delayed queue at the original etas
        assert wait_for(lambda: redis_client.exists("dramatiq:default.DQ", "dramatiq:default.DQ.msgs") == 0)
        dq = broker.delayed_queue("default")
        assert dq.contains(later.message_id)
        [(due, migrated)] = [e for e in dq.read_all() if e[1].message_id == later.message_id]
        assert due == later.options["eta"]
        assert "eta" not in migrated.options and migrated.queue_name == "default"
        # And the near one runs at its eta, once
        assert wait_for(lambda: len(records(redis_client)) == 1, timeout=5)
        [run] = records(redis_client)
        assert run["i"] == 1 and run["at_ms"] >= soon.options["eta"] - 50  # producer clock == server clock here
    finally:
        worker.stop()


def test_undecodable_legacy_entry_goes_to_dead_letters(broker: RedissonBroker, redis_client: redis.Redis) -> None:
    broker.declare_queue("default")
    redis_client.rpush("dramatiq:default.DQ", "bad")
    redis_client.hset("dramatiq:default.DQ.msgs", "bad", b"\xffnope")
    consumer = broker.consume("default", prefetch=1, timeout=50)
    next(consumer)
    consumer.close()
    assert redis_client.hget("dramatiq:default.XQ.msgs", "bad") == b"\xffnope"
    assert not redis_client.exists("dramatiq:default.DQ", "dramatiq:default.DQ.msgs")


def test_unacked_messages_of_a_dead_worker_are_requeued(broker: RedissonBroker, redis_client: redis.Redis) -> None:
    @dramatiq.actor
    def noop() -> None: ...

    # Given a worker that fetched a message and died (its heartbeat is old)
    noop.send()
    dead = broker.consume("default", prefetch=1, timeout=50)
    assert next(dead) is not None
    dead_id = broker.broker_id
    redis_client.zadd("dramatiq:__heartbeats__", {dead_id: server_ms(redis_client) - 10 * broker.heartbeat_timeout})

    # When another worker runs its maintenance
    survivor = RedissonBroker(url=None, client=broker.client, maintenance_interval=1)
    consumer = survivor.consume("default", prefetch=1, timeout=50)
    time.sleep(0.01)
    message = next(consumer) or next(consumer)
    consumer.close()

    # Then the message is given to the survivor, and the dead worker is forgotten
    assert message is not None and message.actor_name == "noop"
    assert redis_client.zscore("dramatiq:__heartbeats__", dead_id) is None


def test_backup_list_is_trimmed_from_its_head_as_entries_move(
    broker: RedissonBroker, redis_client: redis.Redis
) -> None:
    @dramatiq.actor
    def noop(i: int) -> None: ...

    broker.enqueue_many([noop.message(i) for i in range(500)], delay=100)
    consumer = broker.consume("default", prefetch=0, timeout=50)
    assert wait_for(lambda: (next(consumer), redis_client.zcard(ZSET))[1] == 0)
    # Then the next upkeep tick (at most UPKEEP_INTERVAL_MS later) trims what is left
    assert wait_for(lambda: (next(consumer), redis_client.llen(BACKUP))[1] == 0, timeout=2)
    consumer.close()


@pytest.mark.parametrize("pass_running", [False, True])
def test_the_moved_members_record_is_trimmed_and_kept_alive_by_upkeep_ticks(
    broker: RedissonBroker, redis_client: redis.Redis, pass_running: bool
) -> None:
    keys = broker.keys("default")
    now = server_ms(redis_client)
    # Given moved members recorded long ago and just now, a record about to expire, and
    # (or not) a backup-list compaction pass under way
    redis_client.zadd(keys.sent, {"old": now - 10 * broker.dedupe_window, "new": now})
    redis_client.pexpire(keys.sent, 50)
    if pass_running:
        redis_client.set(keys.compact_cursor, 0)
    # When a consumer's transfer runs (with its upkeep interval)
    broker.redisson_scripts.transfer(
        keys,
        limit=100,
        trim_budget=TRIM_BUDGET,
        compact_step=COMPACT_STEP,
        compact_slack=COMPACT_SLACK,
        window_ms=broker.dedupe_window,
        upkeep_ms=UPKEEP_INTERVAL_MS,
    )
    # Then old members left the record and it lives for the window again
    assert redis_client.zrange(keys.sent, 0, -1) == [b"new"]
    assert redis_client.pttl(keys.sent) > broker.dedupe_window


def test_backup_list_compaction_keeps_offer_order_and_bounds_garbage(
    broker: RedissonBroker, redis_client: redis.Redis
) -> None:
    @dramatiq.actor
    def noop(i: int) -> None: ...

    # Given a far-future head, so dead entries cannot be trimmed from the head
    head = broker.enqueue_many([noop.message(i) for i in range(10)], delay=3_600_000)
    near = broker.enqueue_many([noop.message(i) for i in range(3 * COMPACT_SLACK)], delay=50)
    tail = broker.enqueue_many([noop.message(i) for i in range(10)], delay=3_600_000)
    # When all the near ones move (far more dead entries than live ones)
    consumer = broker.consume("default", prefetch=0, timeout=20)
    assert wait_for(lambda: (next(consumer), redis_client.zcard(ZSET))[1] == 20)
    # Then compaction (started at an upkeep tick, a step per call: on a quiet queue per lease
    # renewal) bounds the backup list to 2 x live + slack ...
    assert wait_for(lambda: (next(consumer), redis_client.llen(BACKUP))[1] <= 2 * 20 + COMPACT_SLACK, timeout=20)
    consumer.close()
    assert 2 * 20 + COMPACT_SLACK < len(near)
    # ... and the live entries in it are in offer order
    live = [m.options["redis_message_id"].encode() for m in head + tail]
    backup = [member for member in redis_client.lrange(BACKUP, 0, -1) if member in set(live)]
    assert backup == live


def test_offers_during_a_compaction_pass_keep_their_place(broker: RedissonBroker, redis_client: redis.Redis) -> None:
    @dramatiq.actor
    def noop(i: int) -> None: ...

    keys = broker.keys("default")

    def transfer() -> None:
        broker.redisson_scripts.transfer(keys, limit=100, trim_budget=10, compact_step=50, compact_slack=100)

    # Given a far-future head and many moved entries behind it
    head = broker.enqueue_many([noop.message(i) for i in range(5)], delay=3_600_000)
    broker.enqueue_many([noop.message(i) for i in range(300)], delay=1)
    time.sleep(0.05)
    while redis_client.zcard(ZSET) > 5:
        transfer()
    # When offers arrive while a compaction pass is under way
    if not redis_client.exists(CURSOR):
        transfer()
    assert redis_client.exists(CURSOR)
    middle = [broker.enqueue(noop.message(i), delay=3_600_000) for i in range(3)]
    transfer()
    later = [broker.enqueue(noop.message(i), delay=3_600_000) for i in range(3)]
    while redis_client.exists(CURSOR):
        transfer()
    # Then the pass ends with exactly the live entries, in offer order
    live = [m.options["redis_message_id"].encode() for m in head + middle + later]
    assert redis_client.lrange(BACKUP, 0, -1) == live


def test_migration_leaves_a_legacy_message_a_builtin_worker_fetched_meanwhile(
    broker: RedissonBroker, redis_client: redis.Redis
) -> None:
    # Given a .DQ message that a built-in worker already fetched (off the list, payload kept)
    @dramatiq.actor
    def noop() -> None: ...

    message = noop.message()
    redis_client.hset("dramatiq:default.DQ.msgs", "legacy-1", message.encode())
    # When a migrator that read it earlier tries to claim it
    dues = broker.redisson_scripts.offer(
        broker.keys("default"), [(0, "0" * 16, message.message_id, message.encode(), "legacy-1")], absolute=True
    )
    # Then it is not claimed: no duplicate is scheduled and the built-in worker keeps it
    assert dues == [-1]
    assert broker.delayed_queue("default").size() == 0
    assert redis_client.hexists("dramatiq:default.DQ.msgs", "legacy-1")
