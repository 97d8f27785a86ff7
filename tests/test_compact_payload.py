"""Scheduled payloads name only the sort key; what reaches the ready queue names the member."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import dramatiq
import pytest
import redis
from dramatiq import Worker
from dramatiq.brokers.redis import RedisBroker
from dramatiq.encoder import JSONEncoder, PickleEncoder

from dramatiq_redisson import RedissonBroker
from dramatiq_redisson._limits import COMPACT_SLACK, COMPACT_STEP, TRIM_BUDGET
from dramatiq_redisson._message import encode_scheduled

from .helpers import record, records, wait_for


def _transfer(broker: RedissonBroker, queue_name: str = "default") -> int:
    result = broker.redisson_scripts.transfer(
        broker.keys(queue_name),
        limit=100,
        trim_budget=TRIM_BUDGET,
        compact_step=COMPACT_STEP,
        compact_slack=COMPACT_SLACK,
    )
    return result.moved


@pytest.fixture
def pickle_encoder() -> Iterator[None]:
    dramatiq.set_encoder(PickleEncoder())
    yield
    dramatiq.set_encoder(JSONEncoder())


def test_scheduled_payload_leaves_the_redis_id_out_and_the_ready_copy_names_the_member(
    broker: RedissonBroker, redis_client: redis.Redis
) -> None:
    @dramatiq.actor
    def noop(x: int) -> None: ...

    # Given a message scheduled 50 ms ahead
    message = noop.send_with_options(args=(1,), delay=50)
    member = message.options["redis_message_id"]
    # Then the stored copy leaves redis_message_id out
    stored = redis_client.hget(broker.keys("default").payloads, message.message_id)
    assert stored is not None
    assert b"redis_message_id" not in stored
    # And read_all still shows the full member
    ((_, scheduled),) = broker.delayed_queue("default").read_all()
    assert scheduled.options["redis_message_id"] == member
    # When it is transferred
    time.sleep(0.06)
    assert _transfer(broker) == 1
    # Then the ready copy is valid JSON naming the full member, like any ready message
    ready = redis_client.hget(broker.keys("default").ready_msgs, member)
    assert ready is not None
    assert json.loads(ready)["options"] == {"redis_message_id": member}


def test_other_options_survive_the_transfer(broker: RedissonBroker, redis_client: redis.Redis) -> None:
    @dramatiq.actor
    def noop() -> None: ...

    # Given a scheduled message with options of its own
    message = noop.send_with_options(delay=20, max_retries=3, on_failure="report")
    member = message.options["redis_message_id"]
    time.sleep(0.03)
    # When it is transferred
    assert _transfer(broker) == 1
    # Then its ready copy keeps them all, plus the member
    ready = redis_client.hget(broker.keys("default").ready_msgs, member)
    assert ready is not None
    options = json.loads(ready)["options"]
    assert options == {"redis_message_id": member, "max_retries": 3, "on_failure": "report"}


def test_a_builtin_worker_runs_and_acks_a_transferred_message(
    redis_url: str, broker: RedissonBroker, redis_client: redis.Redis, make_broker: Callable[..., Any]
) -> None:
    # Given a delayed message of ours, moved to the ready queue during a mixed rollout
    @dramatiq.actor(actor_name="shared", max_retries=0)
    def ours(i: int) -> None: ...

    builtin = make_broker(RedisBroker, url=redis_url)

    @dramatiq.actor(broker=builtin, actor_name="shared", max_retries=0)
    def theirs(i: int) -> None:
        record(redis_client, i=i)

    ours.send_with_options(args=(7,), delay=20)
    time.sleep(0.03)
    assert _transfer(broker) == 1
    # When a built-in worker consumes the queue
    worker = Worker(builtin, worker_timeout=100)
    worker.start()
    try:
        assert wait_for(lambda: len(records(redis_client)) == 1)
        # Then it ran once and its ack found the message (nothing left unacked or stored)
        assert wait_for(lambda: not redis_client.hlen("dramatiq:default.msgs"))
    finally:
        worker.stop()
    assert [r["i"] for r in records(redis_client)] == [7]
    assert not redis_client.keys("dramatiq:__acks__.*")


def test_a_non_json_encoder_stores_the_full_member_and_still_delivers(
    broker: RedissonBroker, redis_client: redis.Redis, pickle_encoder: None
) -> None:
    @dramatiq.actor
    def noop() -> None: ...

    # Given messages encoded with pickle
    message = noop.send_with_options(delay=20)
    member = message.options["redis_message_id"]
    # Then the stored copy carries the whole member
    stored = redis_client.hget(broker.keys("default").payloads, message.message_id)
    assert stored is not None and dramatiq.Message.decode(stored[16:]).options["redis_message_id"] == member
    # And the transfer moves it unchanged
    time.sleep(0.03)
    assert _transfer(broker) == 1
    ready = redis_client.hget(broker.keys("default").ready_msgs, member)
    assert ready is not None and dramatiq.Message.decode(ready).options["redis_message_id"] == member


@pytest.mark.parametrize(
    ("args", "message_id"),
    [
        (({"redis_message_id": "x"},), None),  # "redis_message_id":" in an argument
        (({"options": {}},), None),  # a second "options":{
        ((1,), 'id"with-a-quote'),  # would need escaping inside a JSON string
        ((1,), "id\\with-a-backslash"),
    ],
)
def test_ambiguous_messages_are_stored_whole(
    broker: RedissonBroker, redis_client: redis.Redis, args: tuple[object, ...], message_id: str | None
) -> None:
    @dramatiq.actor
    def noop(x: object) -> None: ...

    message = noop.message(*args)
    if message_id is not None:
        message = message.copy(message_id=message_id)
    # Given a message the transfer could not safely complete
    prepared, sort_key = broker.prepare_scheduled(message)
    member = prepared.options["redis_message_id"]
    # When it is encoded for the payload hash
    data = encode_scheduled(prepared, sort_key)
    # Then the full encoding is stored, and the message itself is unchanged
    assert dramatiq.Message.decode(data).options["redis_message_id"] == member
    assert prepared.options["redis_message_id"] == member
    # And it travels through offer and transfer intact
    broker.enqueue(message, delay=10)
    time.sleep(0.02)
    assert _transfer(broker) == 1
    (ready_id,) = redis_client.lrange(broker.keys("default").ready, 0, -1)
    ready = redis_client.hget(broker.keys("default").ready_msgs, ready_id)
    assert ready is not None
    assert dramatiq.Message.decode(ready).options["redis_message_id"] == ready_id.decode()
