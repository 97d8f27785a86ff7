"""The Redisson scheme: key layout, offer, announcements, transfer, timeline."""

from __future__ import annotations

import time

import dramatiq
import redis
from dramatiq import Actor, Worker

from dramatiq_redisson import RedissonBroker
from dramatiq_redisson._producer import BULK_CHUNK_SIZE
from tests.helpers import record, records, server_ms, wait_for


def test_offer_writes_zset_backup_list_and_payload_under_redisson_names(
    broker: RedissonBroker, redis_client: redis.Redis
) -> None:
    # Given an actor on a queue
    @dramatiq.actor(queue_name="orders")
    def remind(order_id: int) -> None: ...

    # When a message is sent with a delay
    before = server_ms(redis_client)
    message = remind.send_with_options(args=(1,), delay=60_000)
    after = server_ms(redis_client)

    # Then the ZSET, the backup list and the payload hash hold it, under Redisson's names
    member = message.options["redis_message_id"].encode()
    assert redis_client.type("redisson_delay_queue_timeout:{dramatiq:orders}") == b"zset"
    due = redis_client.zscore("redisson_delay_queue_timeout:{dramatiq:orders}", member)
    assert before + 60_000 <= due <= after + 60_000
    assert redis_client.lrange("redisson_delay_queue:{dramatiq:orders}", 0, -1) == [member]
    assert redis_client.hexists("redisson_delay_queue_msgs:{dramatiq:orders}", message.message_id)
    # And nothing reaches the ready queue or a built-in .DQ queue
    assert not redis_client.exists("dramatiq:orders", "dramatiq:orders.DQ", "dramatiq:orders.DQ.msgs")
    # The returned message names its due time as the built-in's eta does; the stored copy
    # carries none (a Worker would delay it again)
    assert message.options["eta"] == due
    stored = redis_client.hget("redisson_delay_queue_msgs:{dramatiq:orders}", message.message_id)
    assert stored is not None and b'"eta"' not in stored
    assert broker.get_declared_delay_queues() == set()


def test_offer_announces_only_a_new_earliest_due_time(broker: RedissonBroker, redis_client: redis.Redis) -> None:
    @dramatiq.actor(queue_name="q")
    def noop() -> None: ...

    pubsub = redis_client.pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe("redisson_delay_queue_channel:{dramatiq:q}")
    pubsub.get_message(timeout=1)

    # When offers arrive at 10 s, 20 s (not earliest) and 5 s (earliest)
    noop.send_with_options(delay=10_000)
    noop.send_with_options(delay=20_000)
    noop.send_with_options(delay=5_000)

    # Then exactly two announcements carry the new earliest due times
    announced = []
    while (item := pubsub.get_message(timeout=0.5)) is not None:
        announced.append(int(item["data"]))
    heads = [
        int(s) for _, s in redis_client.zrange("redisson_delay_queue_timeout:{dramatiq:q}", 0, -1, withscores=True)
    ]
    assert len(announced) == 2
    assert announced[1] == heads[0]
    assert announced[0] - announced[1] > 4_000
    pubsub.close()


def test_delayed_message_runs_after_its_delay_and_not_before(
    broker: RedissonBroker, worker: Worker, redis_client: redis.Redis, stamp: Actor[[int | None], None]
) -> None:
    message = stamp.send_with_options(delay=300)
    due = int(
        redis_client.zscore("redisson_delay_queue_timeout:{dramatiq:default}", message.options["redis_message_id"])
    )
    broker.join("default", timeout=5_000)
    worker.join()

    [run] = records(redis_client)
    assert due <= run["at_ms"] <= due + 100


def test_transferred_message_carries_no_eta_and_the_worker_holds_no_delayed_message(
    broker: RedissonBroker, worker: Worker
) -> None:
    seen: list[dict[str, object]] = []

    @dramatiq.actor
    def capture() -> None:
        seen.append(dict(dramatiq.middleware.CurrentMessage.get_current_message().options))

    broker.add_middleware(dramatiq.middleware.CurrentMessage())
    for _ in range(5):
        capture.send_with_options(delay=2_000)
    time.sleep(0.3)
    # While the messages wait, no consumer thread keeps them in memory
    assert all(consumer.delay_queue.qsize() == 0 for consumer in worker.consumers.values())
    assert set(worker.consumers) == {"default"}
    broker.join("default", timeout=10_000)
    worker.join()
    assert len(seen) == 5
    assert all("eta" not in options for options in seen)


def test_redisson_timeline_is_delivered_in_due_order_none_early(
    broker: RedissonBroker, worker: Worker, redis_client: redis.Redis
) -> None:
    # Redisson's own scenario: "1"@1s, "2"@5s, "4"@4s, "2"@2s, "3"@3s -> 1, 2, 3, 4, 2
    @dramatiq.actor(queue_name="timeline")
    def deliver(value: str) -> None:
        record(redis_client, value=value)

    dues = {}
    for value, seconds in [("1", 1), ("2", 5), ("4", 4), ("2", 2), ("3", 3)]:
        message = deliver.send_with_options(args=(value,), delay=seconds * 1000)
        member = message.options["redis_message_id"]
        dues[member] = int(redis_client.zscore("redisson_delay_queue_timeout:{dramatiq:timeline}", member))
    broker.join("timeline", timeout=10_000)
    worker.join()

    runs = records(redis_client)
    assert [r["value"] for r in runs] == ["1", "2", "3", "4", "2"]
    lateness = [run["at_ms"] - due for run, due in zip(runs, sorted(dues.values()), strict=True)]
    assert all(0 <= late <= 100 for late in lateness), lateness


def test_entries_due_in_the_same_millisecond_move_in_offer_order(
    broker: RedissonBroker, redis_client: redis.Redis
) -> None:
    @dramatiq.actor(queue_name="burst")
    def noop(i: int) -> None: ...

    # Given a chunk of messages offered in one bulk script call, so they share one due time
    messages = broker.enqueue_many([noop.message(i) for i in range(BULK_CHUNK_SIZE)], delay=200)
    scores = {
        s for _, s in redis_client.zrange("redisson_delay_queue_timeout:{dramatiq:burst}", 0, -1, withscores=True)
    }
    assert len(scores) == 1
    # When a consumer's timer moves them
    consumer = broker.consume("burst", prefetch=1, timeout=100)
    assert wait_for(
        lambda: (next(consumer), redis_client.zcard("redisson_delay_queue_timeout:{dramatiq:burst}"))[1] == 0
    )
    consumer.close()
    # Then the ready queue holds them in offer order
    ready = [i.decode() for i in redis_client.lrange("dramatiq:burst", 0, -1)]
    expected = [m.options["redis_message_id"] for m in messages]
    assert ready == expected[len(expected) - len(ready) :]


def test_consumer_recovers_after_its_subscription_is_killed(
    broker: RedissonBroker, worker: Worker, redis_client: redis.Redis, stamp: Actor[[int | None], None]
) -> None:
    # Given a running worker whose pub/sub connection gets killed
    time.sleep(0.3)
    assert redis_client.client_kill_filter(_type="pubsub") >= 1
    # When a message is offered while the subscription is down
    stamp.send_with_options(delay=200)
    # Then it still runs (resubscribe -> transfer, or the safety check)
    assert wait_for(lambda: len(records(redis_client)) == 1, timeout=10)


def test_entry_offered_without_announcement_runs_by_the_safety_check(
    broker: RedissonBroker, worker: Worker, redis_client: redis.Redis, stamp: Actor[[int | None], None]
) -> None:
    # Given a worker idling on an empty delayed queue
    time.sleep(0.3)
    # When an entry appears without any announcement (as if its PUBLISH were lost)
    sort_key = "0" * 16
    message = stamp.message().copy(options={"redis_message_id": sort_key + "lost"})
    message = message.copy(message_id="lost")
    due = server_ms(redis_client) + 100
    redis_client.zadd("redisson_delay_queue_timeout:{dramatiq:default}", {sort_key + "lost": due})
    redis_client.rpush("redisson_delay_queue:{dramatiq:default}", sort_key + "lost")
    redis_client.hset("redisson_delay_queue_msgs:{dramatiq:default}", "lost", sort_key.encode() + message.encode())
    # Then it runs within the safety interval
    assert wait_for(lambda: len(records(redis_client)) == 1, timeout=broker.safety_interval / 1000 + 5)


def test_many_consumers_move_every_entry_exactly_once(broker: RedissonBroker, redis_client: redis.Redis) -> None:
    @dramatiq.actor(queue_name="race")
    def noop(i: int) -> None: ...

    count = 2_000
    broker.enqueue_many([noop.message(i) for i in range(count)], delay=300)
    consumers = [broker.consume("race", prefetch=0, timeout=50) for _ in range(4)]
    # prefetch=0: the consumers only run their timers, they fetch nothing
    deadline = time.monotonic() + 10
    while redis_client.zcard("redisson_delay_queue_timeout:{dramatiq:race}") and time.monotonic() < deadline:
        for consumer in consumers:
            next(consumer)
    for consumer in consumers:
        consumer.close()
    ready = redis_client.lrange("dramatiq:race", 0, -1)
    assert len(ready) == count
    assert len(set(ready)) == count
    assert redis_client.hlen("dramatiq:race.msgs") == count
    assert redis_client.hlen("redisson_delay_queue_msgs:{dramatiq:race}") == 0
