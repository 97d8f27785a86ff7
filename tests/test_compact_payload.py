"""Scheduled payloads name only the sort key; what reaches the ready queue names the member."""

from __future__ import annotations

import dataclasses
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
from dramatiq_redisson._ids import sort_key_length
from dramatiq_redisson._message import RS, decode_scheduled, encode_scheduled, ready_body
from dramatiq_redisson._tuning import COMPACT_SLACK, COMPACT_STEP, TRIM_BUDGET
from tests.helpers import record, records, server_ms, wait_for


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
    assert (
        stored is not None
        and dramatiq.Message.decode(stored[sort_key_length(stored) :]).options["redis_message_id"] == member
    )
    # And the transfer moves it unchanged
    time.sleep(0.03)
    assert _transfer(broker) == 1
    ready = redis_client.hget(broker.keys("default").ready_msgs, member)
    assert ready is not None and dramatiq.Message.decode(ready).options["redis_message_id"] == member


@pytest.mark.parametrize(
    ("args", "message_id", "compact"),
    [
        (({"redis_message_id": "x"},), None, True),  # an option's name in an argument
        (({"options": {}},), None, True),  # a field's name in an argument
        (("\x1e",), None, True),  # the separator in an argument (JSON escapes it)
        ((1,), 'id"with-a-quote', False),  # would need escaping inside a JSON string
        ((1,), "id\\with-a-backslash", False),
        ((1,), "id-\u00e9", False),  # not ASCII
    ],
)
def test_messages_travel_intact_whichever_form_is_stored(
    broker: RedissonBroker, redis_client: redis.Redis, args: tuple[object, ...], message_id: str | None, compact: bool
) -> None:
    @dramatiq.actor
    def noop(x: object) -> None: ...

    message = noop.message(*args)
    if message_id is not None:
        message = message.copy(message_id=message_id)
    prepared, sort_key = broker.prepare_scheduled(message)
    member = prepared.options["redis_message_id"]
    # When it is encoded for the payload hash
    data = encode_scheduled(prepared, sort_key)
    # Then it is compact only where the transfer can write it back faithfully
    assert data.startswith(RS) == compact
    assert decode_scheduled(member.encode(), sort_key.encode() + data, "default").asdict() == prepared.asdict()
    assert prepared.options["redis_message_id"] == member
    # And it travels through offer and transfer intact
    broker.enqueue(message, delay=10)
    time.sleep(0.02)
    assert _transfer(broker) == 1
    (ready_id,) = redis_client.lrange(broker.keys("default").ready, 0, -1)
    ready = redis_client.hget(broker.keys("default").ready_msgs, ready_id)
    assert ready is not None
    delivered = dramatiq.Message.decode(ready)
    assert delivered.options["redis_message_id"] == ready_id.decode()
    assert (delivered.args, delivered.message_id) == (tuple(json.loads(json.dumps(args))), message.message_id)


ODD_MESSAGES: list[dict[str, Any]] = [
    {"args": (1,)},
    {"args": (), "kwargs": {"a": [1, 2.5, None, True], "b": {"c": "d"}}},
    {"args": ("Zürich", 'say "hi"', "back\\slash", "\x00\x1e\n", "😀"), "kwargs": {"ü": 1}},
    {"args": (2**70, -0.0, 1e300, 3.141592653589793)},
    {"args": (1,), "options": {"max_retries": 3, "on_failure": "report", "nested": {"x": [1]}}},
    {"args": (1,), "options": {"eta": 1}},
]


@pytest.mark.parametrize("fields", ODD_MESSAGES)
@pytest.mark.parametrize("queue_name", ["default", "q.x-1"])
def test_the_compact_payload_becomes_what_dramatiqs_encoder_writes(
    broker: RedissonBroker, redis_client: redis.Redis, fields: dict[str, Any], queue_name: str
) -> None:
    @dramatiq.actor(queue_name=queue_name)
    def odd(*args: Any, **kwargs: Any) -> None: ...

    message = odd.message_with_options(
        args=fields["args"], kwargs=fields.get("kwargs", {}), **fields.get("options", {})
    )
    # Given a message scheduled compactly
    sent = broker.enqueue(message, delay=10)
    member = sent.options["redis_message_id"]
    keys = broker.keys(queue_name)
    stored = redis_client.hget(keys.payloads, message.message_id)
    assert stored is not None and stored[sort_key_length(stored) :][:1] == RS, stored
    time.sleep(0.02)
    # When the transfer moves it
    assert _transfer(broker, queue_name) == 1
    ready = redis_client.hget(keys.ready_msgs, member)
    assert ready is not None
    # Then the ready copy is, byte for byte, the mirror's (ready_body) and Dramatiq's
    # encoding of the message with redis_message_id first among its options
    assert ready == ready_body(member.encode(), stored[sort_key_length(stored) :], queue_name)
    options = {k: v for k, v in sent.options.items() if k not in ("eta", "redis_message_id")}
    expected = dataclasses.replace(sent, options={"redis_message_id": member, **options})
    assert ready == expected.encode()


def test_the_compact_payload_is_a_fifth_of_the_json(broker: RedissonBroker, redis_client: redis.Redis) -> None:
    @dramatiq.actor(actor_name="bench_record")
    def bench_record(seq: int) -> None: ...

    message = broker.enqueue(bench_record.message(123), delay=60_000)
    stored = redis_client.hget(broker.keys("default").payloads, message.message_id)
    assert stored is not None
    whole = message.copy(options={}).encode()
    assert len(stored) - sort_key_length(stored) <= len(whole) // 4, (stored, whole)


class RecordSeparatorEncoder(JSONEncoder):
    """An encoder (not Dramatiq's JSON one) whose bytes begin with the compact marker."""

    def encode(self, data: Any) -> bytes:
        return RS + super().encode(data)

    def decode(self, data: bytes) -> Any:
        assert data[:1] == RS, data
        return super().decode(data[1:])


def test_another_encoders_bytes_that_begin_with_the_marker_are_stored_escaped(
    broker: RedissonBroker, redis_client: redis.Redis
) -> None:
    dramatiq.set_encoder(RecordSeparatorEncoder())
    try:

        @dramatiq.actor
        def noop(x: int) -> None: ...

        message = noop.send_with_options(args=(5,), delay=10)
        stored = redis_client.hget(broker.keys("default").payloads, message.message_id)
        assert stored is not None and stored[sort_key_length(stored) :][:2] == RS + RS
        time.sleep(0.02)
        assert _transfer(broker) == 1
        ready = redis_client.hget(broker.keys("default").ready_msgs, message.options["redis_message_id"])
        assert ready is not None and dramatiq.Message.decode(ready).args == (5,)
    finally:
        dramatiq.set_encoder(JSONEncoder())


def test_messages_scheduled_by_earlier_releases_run_on_time_exactly_once(
    broker: RedissonBroker, redis_client: redis.Redis
) -> None:
    @dramatiq.actor(max_retries=0)
    def remember(i: int) -> None:
        record(redis_client, i=i)

    keys = broker.keys("default")
    due_at: dict[int, int] = {}
    now = server_ms(redis_client)
    # Given messages scheduled with plain commands in the layouts of earlier releases (16-char
    # sort keys; the JSON message without redis_message_id, the release before compact
    # payloads, and with it, the one before that), beside compact ones offered by this
    # release (14-char sort keys)
    for i in range(30):
        # (earlier releases' sort keys: 16 hex characters, milliseconds above a 20-bit counter)
        sort_key = f"{(int(time.time() * 1000) << 20) + i:016x}"
        prepared, _ = broker.prepare_scheduled(remember.message(i), sort_key)
        member = prepared.options["redis_message_id"]
        assert sort_key_length(member) == 16
        due_at[i] = now + 300 + 10 * i
        if i % 3 == 2:
            broker.enqueue(remember.message(i), delay=due_at[i] - server_ms(redis_client))
            continue
        if i % 3 == 0:
            body = dataclasses.replace(prepared, options={}).encode()
            assert b"redis_message_id" not in body
        else:
            body = prepared.encode()
        redis_client.zadd(keys.timeout_zset, {member: due_at[i]})
        redis_client.rpush(keys.backup_list, member)
        redis_client.hset(keys.payloads, prepared.message_id, sort_key.encode() + body)
    # When a worker of this release runs the queue
    worker = Worker(broker, worker_timeout=50)
    worker.start()
    try:
        assert wait_for(lambda: len(records(redis_client)) >= 30)
        time.sleep(0.2)
    finally:
        worker.stop()
    # Then each ran exactly once, none early, each within 250 ms of its due time
    runs = records(redis_client)
    assert sorted(r["i"] for r in runs) == list(range(30))
    for r in runs:
        late = r["at_ms"] - due_at[r["i"]]
        assert 0 <= late < 250, (r, late)
    assert redis_client.zcard(keys.timeout_zset) == 0 and redis_client.hlen(keys.payloads) == 0


@pytest.mark.parametrize("timestamp", [0, 1, -5, 10**15, 2**63, 1.5, "text", None, "now - 1 h", "now + 1 s"])
def test_any_timestamp_comes_back_as_it_was(
    broker: RedissonBroker, redis_client: redis.Redis, timestamp: object
) -> None:
    @dramatiq.actor
    def noop(i: int) -> None: ...

    now = int(time.time() * 1000)
    if timestamp == "now - 1 h":
        timestamp = now - 3_600_000  # a retry keeps its first send's timestamp
    elif timestamp == "now + 1 s":
        timestamp = now + 1000  # a producer whose clock runs ahead
    message = dataclasses.replace(noop.message(1), message_timestamp=timestamp)
    # Given a message with that timestamp, scheduled and moved
    sent = broker.enqueue(message, delay=10)
    member = sent.options["redis_message_id"]
    time.sleep(0.02)
    assert _transfer(broker) == 1
    # Then the ready copy carries the timestamp unchanged
    ready = redis_client.hget(broker.keys("default").ready_msgs, member)
    assert ready is not None
    assert json.loads(ready)["message_timestamp"] == timestamp
    assert dramatiq.Message.decode(ready).message_timestamp == timestamp
