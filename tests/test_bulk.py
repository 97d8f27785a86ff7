"""enqueue_many: the streamed bulk offer keeps enqueue's semantics."""

from __future__ import annotations

import dramatiq
import pytest
import redis

from dramatiq_redisson import EnqueueError, RedissonBroker
from dramatiq_redisson._ids import same_sort_key
from dramatiq_redisson._producer import BULK_CHUNK_SIZE
from tests.helpers import server_ms

ZSET = "redisson_delay_queue_timeout:{dramatiq:default}"
BACKUP = "redisson_delay_queue:{dramatiq:default}"
PAYLOADS = "redisson_delay_queue_msgs:{dramatiq:default}"


def test_enqueue_many_schedules_every_message_at_server_time_plus_delay(
    broker: RedissonBroker, redis_client: redis.Redis
) -> None:
    @dramatiq.actor
    def noop(i: int) -> None: ...

    # When more than one chunk is offered in bulk
    count = 3 * BULK_CHUNK_SIZE + 7
    before = server_ms(redis_client)
    messages = broker.enqueue_many([noop.message(i) for i in range(count)], delay=60_000)
    after = server_ms(redis_client)
    # Then every message is scheduled once, under its member, at server time + delay
    members = [m.options["redis_message_id"] for m in messages]
    scores = dict(redis_client.zrange(ZSET, 0, -1, withscores=True))
    assert sorted(scores) == sorted(m.encode() for m in members)
    assert all(before + 60_000 <= s <= after + 60_000 for s in scores.values())
    assert [m.decode() for m in redis_client.lrange(BACKUP, 0, -1)] == members
    assert redis_client.hlen(PAYLOADS) == count


def test_enqueue_many_reschedules_a_message_id_offered_again(broker: RedissonBroker, redis_client: redis.Redis) -> None:
    @dramatiq.actor
    def noop(i: int) -> None: ...

    # Given a scheduled message
    first = noop.message(1)
    broker.enqueue_many([first], delay=60_000)
    # When the same message id is offered again, twice within one bulk call
    (_, _, last) = broker.enqueue_many([first, noop.message(2), first], delay=120_000)
    # Then it is scheduled once, as the last offer says, and its payload matches
    assert redis_client.zcard(ZSET) == 2
    assert redis_client.zscore(ZSET, last.options["redis_message_id"]) is not None
    stored = redis_client.hget(PAYLOADS, first.message_id)
    assert stored is not None and same_sort_key(stored, last.options["redis_message_id"].encode())
    assert broker.delayed_queue("default").contains(first.message_id)


def test_enqueue_many_with_an_unencodable_argument_writes_nothing(
    broker: RedissonBroker, redis_client: redis.Redis
) -> None:
    @dramatiq.actor
    def noop(x: object) -> None: ...

    # Given a batch whose last message cannot be encoded
    messages = [noop.message(i) for i in range(2 * BULK_CHUNK_SIZE)] + [noop.message(object())]
    declared = set(redis_client.keys("*"))  # the queue registry: the actor's queue was declared
    # Then the call raises and nothing was written
    with pytest.raises(TypeError):
        broker.enqueue_many(messages, delay=60_000)
    assert set(redis_client.keys("*")) == declared


def test_enqueue_many_raises_a_server_error_and_leaves_the_client_usable(
    broker: RedissonBroker, redis_client: redis.Redis
) -> None:
    @dramatiq.actor
    def noop(i: int) -> None: ...

    # Given a queue whose ZSET key holds the wrong type
    redis_client.set(ZSET, "not a zset")
    # When messages are offered in bulk
    with pytest.raises(EnqueueError, match="WRONGTYPE") as raised:
        broker.enqueue_many([noop.message(i) for i in range(2 * BULK_CHUNK_SIZE)], delay=60_000)
    # Then the error says that none was enqueued, with the server's error as its cause
    assert isinstance(raised.value.__cause__, redis.ResponseError)
    assert len(raised.value.failed) == 2 * BULK_CHUNK_SIZE
    assert raised.value.enqueued == raised.value.unknown == []
    # Then the broker's connections still answer correctly afterwards
    redis_client.delete(ZSET)
    for _ in range(3):
        assert broker.client.ping() is True
    messages = broker.enqueue_many([noop.message(i) for i in range(5)], delay=60_000)
    assert redis_client.zcard(ZSET) == len(messages) == 5


def test_enqueue_many_runs_hooks_set_on_a_middleware_instance(broker: RedissonBroker) -> None:
    @dramatiq.actor
    def noop(i: int) -> None: ...

    # Given a middleware whose hook is an instance attribute, not a method of its class
    seen: list[str] = []
    spy = dramatiq.Middleware()
    spy.before_enqueue = lambda broker, message, delay: seen.append(message.message_id)  # type: ignore[method-assign]
    broker.add_middleware(spy)
    # When messages are offered in bulk
    messages = broker.enqueue_many([noop.message(i) for i in range(3)], delay=60_000)
    # Then the hook saw every one
    assert seen == [m.message_id for m in messages]
