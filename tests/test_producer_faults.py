"""The producer side under faults, on a real server: a script cache flushed mid-stream,
a server that fills up mid-stream or is full, replies lost on a cut connection, and
sends repeated after a lost reply. Every message must end up enqueued exactly once,
and an error must say exactly which messages are in Redis."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import dramatiq
import pytest
import redis
from dramatiq.broker import MessageProxy
from dramatiq.message import Message
from redis.backoff import NoBackoff
from redis.retry import Retry

from dramatiq_redisson import EnqueueError, RedissonBroker, ServerMemoryFull
from dramatiq_redisson._ids import message_id_of
from dramatiq_redisson._producer import BULK_CHUNK_SIZE, RESEND_MARGIN_MS
from dramatiq_redisson.scripts._calls import CLOCK_ESTIMATE_TTL, _enqueue_args, _enqueue_keys
from tests.helpers import fill_to_maxmemory, server_ms, wait_for

# -- helpers -------------------------------------------------------------------------


class CuttingProxy:
    """A TCP proxy in front of the server that can lose replies, as a network can.

    ``lose_next_reply()``: the reply to the next command that contains ``trigger`` is
    dropped and the connection closed (the command ran; its client sees a connection
    error). ``cut_after(n)``: once a command containing ``trigger`` has gone through,
    only ``n`` more bytes of replies are forwarded, then the connection is closed.
    """

    def __init__(self, host: str, port: int) -> None:
        self.upstream = (host, port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.listener.getsockname()[1])
        self.trigger = b"EVALSHA"
        self._budget: int | None = None  # reply bytes still forwarded once triggered
        self._armed = False
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def lose_next_reply(self, trigger: bytes = b"EVALSHA") -> None:
        self.cut_after(0, trigger)

    def cut_after(self, n: int, trigger: bytes = b"EVALSHA") -> None:
        with self._lock:
            self.trigger, self._budget, self._armed = trigger, n, False

    def close(self) -> None:
        self.listener.close()
        for s in self._sockets:
            _close(s)

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.upstream)
            self._sockets += [client, upstream]
            threading.Thread(target=self._up, args=(client, upstream), daemon=True).start()
            threading.Thread(target=self._down, args=(upstream, client), daemon=True).start()

    def _up(self, client: socket.socket, upstream: socket.socket) -> None:
        forwarding = True
        try:
            while data := client.recv(65536):
                with self._lock:
                    if self._budget is not None and self.trigger in data:
                        self._armed = True
                if forwarding:
                    try:
                        upstream.sendall(data)
                    except OSError:
                        forwarding = False  # cut: what the client still sends is lost
        except OSError:
            pass
        _close(client)
        _close(upstream)

    def _down(self, upstream: socket.socket, client: socket.socket) -> None:
        try:
            while data := upstream.recv(65536):
                with self._lock:
                    cut = False
                    if self._armed and self._budget is not None:
                        data, self._budget = data[: self._budget], self._budget - len(data)
                        if self._budget <= 0:
                            cut, self._budget, self._armed = True, None, False
                if data:
                    client.sendall(data)
                if cut:
                    # The client reads the end of the stream; its later commands are lost.
                    _close(upstream)
                    client.shutdown(socket.SHUT_WR)
                    return
        except OSError:
            pass
        _close(client)
        _close(upstream)


def _close(s: socket.socket) -> None:
    try:
        s.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    s.close()


@pytest.fixture
def proxy(redis_url: str) -> Iterator[CuttingProxy]:
    parts = urlsplit(redis_url)
    p = CuttingProxy(parts.hostname or "127.0.0.1", parts.port or 6379)
    yield p
    p.close()


@pytest.fixture
def memory_limit(redis_client: redis.Redis) -> Iterator[redis.Redis]:
    """Lets a test set ``maxmemory`` (noeviction); restores ``maxmemory 0`` afterwards."""
    policy = redis_client.config_get("maxmemory-policy")["maxmemory-policy"]
    try:
        redis_client.config_set("maxmemory-policy", "noeviction")
        yield redis_client
    finally:
        redis_client.config_set("maxmemory", 0)
        redis_client.config_set("maxmemory-policy", policy)
        redis_client.delete(*[f"ballast:{i}" for i in range(4096)])


def _keys_snapshot(client: redis.Redis) -> dict[bytes, Any]:
    """Every key's type and content (ballast left out)."""
    snapshot: dict[bytes, Any] = {}
    for key in client.keys("*"):
        if key.startswith(b"ballast:"):
            continue
        kind = client.type(key)
        if kind == b"list":
            snapshot[key] = client.lrange(key, 0, -1)
        elif kind == b"hash":
            snapshot[key] = client.hgetall(key)
        elif kind == b"zset":
            snapshot[key] = client.zrange(key, 0, -1, withscores=True)
        else:
            snapshot[key] = client.dump(key)
    return snapshot


def _scheduled_ids(broker: RedissonBroker, queue: str = "default") -> list[str]:
    """Message ids in the ZSET, one per member (so a duplicate shows twice)."""
    members = broker.client.zrange(broker.keys(queue).timeout_zset, 0, -1)
    return [message_id_of(m) for m in members]


def _ready_ids(broker: RedissonBroker, queue: str = "default") -> list[str]:
    return [i.decode() for i in broker.client.lrange(broker.keys(queue).ready, 0, -1)]


class _Flusher:
    """Runs SCRIPT FLUSH in a tight loop on its own connection."""

    def __init__(self, url: str) -> None:
        self.client = redis.Redis.from_url(url)
        self.stop = threading.Event()
        self.flushes = 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.is_set():
            self.client.script_flush()
            self.flushes += 1

    def __enter__(self) -> _Flusher:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()
        self.client.close()


# -- NOSCRIPT ---------------------------------------------------------------------------


@pytest.mark.parametrize("delay", [60_000, None])
def test_enqueue_many_under_a_script_flush_storm_enqueues_every_message_once(
    broker: RedissonBroker, redis_url: str, delay: int | None
) -> None:
    @dramatiq.actor
    def noop(i: int) -> None: ...

    # While another client flushes the script cache in a tight loop
    with _Flusher(redis_url) as flusher:
        batches = [broker.enqueue_many([noop.message(i) for i in range(2_000)], delay=delay) for _ in range(3)]
    assert flusher.flushes > 10
    # Then every message of every batch is in Redis exactly once, nothing else is
    expected = sorted(m.message_id for batch in batches for m in batch)
    if delay:
        assert sorted(_scheduled_ids(broker)) == expected
        assert broker.client.hlen(broker.keys("default").payloads) == len(expected)
        assert broker.client.llen(broker.keys("default").backup_list) == len(expected)
    else:
        assert sorted(_ready_ids(broker)) == expected
        assert broker.client.hlen(broker.keys("default").ready_msgs) == len(expected)


def test_single_sends_under_a_script_flush_storm_enqueue_once(broker: RedissonBroker, redis_url: str) -> None:
    @dramatiq.actor
    def noop(i: int) -> None: ...

    # While the script cache is flushed in a tight loop, messages are sent one by one
    with _Flusher(redis_url):
        later = [noop.send_with_options(args=(i,), delay=60_000) for i in range(300)]
        now = [noop.send(i) for i in range(300)]
    # Then each is enqueued once
    assert sorted(_scheduled_ids(broker)) == sorted(m.message_id for m in later)
    assert sorted(_ready_ids(broker)) == sorted(m.message_id for m in now)


# -- partial failures: the error says exactly what is in Redis ---------------------------------


def test_a_server_error_on_one_queue_lists_exactly_what_was_enqueued(broker: RedissonBroker) -> None:
    @dramatiq.actor(queue_name="good")
    def good(i: int) -> None: ...

    @dramatiq.actor(queue_name="bad")
    def bad(i: int) -> None: ...

    # Given a queue whose ready queue holds the wrong type
    broker.client.set(broker.keys("bad").ready, "not a list")
    messages = [good.message(i) for i in range(150)] + [bad.message(i) for i in range(250)]
    # When a batch for both queues is sent
    with pytest.raises(EnqueueError, match="WRONGTYPE") as raised:
        broker.enqueue_many(messages)
    # Then the error lists the good queue's messages as enqueued, the bad one's as failed
    error = raised.value
    assert [m.message_id for m in error.enqueued] == [m.message_id for m in messages[:150]]
    assert [m.message_id for m in error.failed] == [m.message_id for m in messages[150:]]
    assert error.unknown == []
    assert sorted(_ready_ids(broker, "good")) == sorted(m.message_id for m in messages[:150])
    assert broker.client.hlen(broker.keys("bad").ready_msgs) == 0


@pytest.mark.parametrize("delay", [60_000, None])
def test_a_server_filling_up_mid_stream_is_reported_message_by_message(
    broker: RedissonBroker, memory_limit: redis.Redis, delay: int | None
) -> None:
    @dramatiq.actor
    def noop(i: int, pad: str) -> None: ...

    count = 40 * BULK_CHUNK_SIZE
    messages = [noop.message(i, "p" * 200) for i in range(count)]  # ~2 MB in all
    # Given a server with room for only part of the batch
    assert wait_for(lambda: int(memory_limit.info("memory").get("lazyfree_pending_objects", 0)) == 0)
    memory_limit.config_set("maxmemory", int(memory_limit.info("memory")["used_memory"]) + 512 * 1024)
    # When the batch is sent
    with pytest.raises(ServerMemoryFull) as raised:
        broker.enqueue_many(messages, delay=delay)
    error = raised.value
    # Then the error names the limit and the queue, and keeps the server's error
    assert "maxmemory" in str(error) and "'default'" in str(error)
    assert isinstance(error.__cause__, redis.exceptions.OutOfMemoryError)
    assert error.maxmemory and error.used_memory and error.queue_names == ["default"]
    # And it lists exactly the messages that are in Redis, and every message once
    keys = broker.keys("default")
    stored = _scheduled_ids(broker) if delay else _ready_ids(broker)
    assert 0 < len(error.enqueued) < count and error.unknown == []
    assert sorted(stored) == sorted(m.message_id for m in error.enqueued)
    assert len(error.enqueued) + len(error.failed) == count
    payloads = broker.client.hlen(keys.payloads if delay else keys.ready_msgs)
    assert payloads == len(error.enqueued)
    # When memory is freed and the producer sends the batch again
    memory_limit.config_set("maxmemory", 0)
    broker.enqueue_many(messages, delay=delay)
    # Then every message is there exactly once
    stored = _scheduled_ids(broker) if delay else _ready_ids(broker)
    assert sorted(stored) == sorted(m.message_id for m in messages)


@pytest.mark.parametrize("delay", [60_000, None])
def test_replies_lost_on_a_cut_connection_are_unknown_and_a_resend_enqueues_each_once(
    redis_url: str, redis_client: redis.Redis, proxy: CuttingProxy, make_broker: Any, delay: int | None
) -> None:
    broker: RedissonBroker = make_broker(url=f"redis://127.0.0.1:{proxy.port}/0")
    dramatiq.set_broker(broker)

    @dramatiq.actor
    def noop(i: int) -> None: ...

    count = 20 * BULK_CHUNK_SIZE
    messages = [noop.message(i) for i in range(count)]
    # Given a connection cut after the script load's reply and a few script replies
    proxy.cut_after(80)  # a few replies: *2 :100 :<epoch ms> (26 B) or *2 :<length> :100 (16-18 B)
    # When the batch is streamed through it
    with pytest.raises(EnqueueError) as raised:
        broker.enqueue_many(messages, delay=delay)
    error = raised.value
    assert isinstance(error.__cause__, redis.ConnectionError)
    # Then the calls whose replies were read are enqueued, the rest unknown (or failed
    # when they were never sent), and what is in Redis lies within enqueued + unknown
    assert 0 < len(error.enqueued) < count and len(error.enqueued) % BULK_CHUNK_SIZE == 0
    assert len(error.unknown) > 0
    assert len(error.enqueued) + len(error.unknown) + len(error.failed) == count
    stored = set(_scheduled_ids(broker) if delay else _ready_ids(broker))
    assert {m.message_id for m in error.enqueued} <= stored
    assert stored <= {m.message_id for m in error.enqueued + error.unknown}
    assert not stored & {m.message_id for m in error.failed}
    # When the producer sends what is not known to be enqueued again
    broker.enqueue_many(error.unknown + error.failed, delay=delay)
    # Then every message is in Redis exactly once
    stored_list = _scheduled_ids(broker) if delay else _ready_ids(broker)
    assert sorted(stored_list) == sorted(m.message_id for m in messages)


# -- a send repeated after a lost reply runs once ----------------------------------------------


@pytest.mark.parametrize("delay", [None, 60_000], ids=["immediate", "delayed"])
def test_the_clients_own_retry_of_an_executed_send_enqueues_it_once(
    redis_client: redis.Redis, proxy: CuttingProxy, make_broker: Any, delay: int | None
) -> None:
    # Given a broker on redis-py's default client, which retries a command on a
    # connection error, behind a proxy that loses the reply to the next script call
    broker: RedissonBroker = make_broker(host="127.0.0.1", port=proxy.port)
    dramatiq.set_broker(broker)

    @dramatiq.actor
    def noop() -> None: ...

    broker.client.ping()
    proxy.lose_next_reply()
    # When a message is sent (the call runs, its reply is lost, the client sends it again;
    # a delayed one through the one-message offer)
    message = noop.send_with_options(delay=delay)
    assert proxy._budget is None, "the reply was not lost"
    if delay is None:
        # Then it is on the ready queue once
        assert _ready_ids(broker) == [message.message_id]
        assert message.options["redis_message_id"] == message.message_id
    else:
        # Then it is scheduled and listed once
        keys = broker.keys("default")
        member = message.options["redis_message_id"].encode()
        assert redis_client.zrange(keys.timeout_zset, 0, -1) == [member]
        assert redis_client.lrange(keys.backup_list, 0, -1) == [member]


def test_an_immediate_message_sent_again_is_not_enqueued_twice(broker: RedissonBroker, make_worker: Any) -> None:
    runs: list[str] = []

    @dramatiq.actor(max_retries=0)
    def remember(tag: str) -> None:
        runs.append(tag)

    # Given a message sent, then sent again while it is still queued
    message = remember.message("once")
    broker.enqueue(message)
    broker.enqueue(message)
    broker.enqueue_many([message, message])
    assert _ready_ids(broker) == [message.message_id]
    # When it has run and been acked, and it is sent again within the dedupe window
    make_worker()
    assert wait_for(lambda: broker.pending("default") == 0 and runs == ["once"])
    assert broker.client.hlen(broker.keys("default").ready_msgs) == 0
    broker.enqueue(message)
    broker.enqueue_many([message])
    # Then it does not run again
    broker.join("default", timeout=5_000)
    assert runs == ["once"]


def test_the_dedupe_window_expires_and_is_trimmed(redis_url: str, redis_client: redis.Redis, make_broker: Any) -> None:
    broker: RedissonBroker = make_broker(url=redis_url, dedupe_window=300)
    dramatiq.set_broker(broker)
    assert broker.dedupe_window == 300  # a URL client does not retry by itself

    @dramatiq.actor
    def noop(i: int) -> None: ...

    keys = broker.keys("default")
    first = noop.message(1)
    broker.enqueue(first)
    # Given the first copy consumed (as a worker's fetch and ack would)
    redis_client.lpop(keys.ready)
    redis_client.hdel(keys.ready_msgs, first.message_id)
    broker.enqueue(first)
    assert _ready_ids(broker) == []
    # When the window has passed
    assert wait_for(lambda: redis_client.exists(keys.sent) == 0, timeout=3)
    # Then the same message id is enqueued again, and old entries leave the record
    broker.enqueue(first)
    assert _ready_ids(broker) == [first.message_id]
    broker.enqueue_many([noop.message(i) for i in range(5)])
    assert redis_client.zcard(keys.sent) == 6
    assert wait_for(lambda: redis_client.exists(keys.sent) == 0, timeout=3)


def test_the_dedupe_window_reads_each_records_time_so_a_call_need_not_trim(
    broker: RedissonBroker, redis_client: redis.Redis
) -> None:
    """enqueue.lua trims the window's record on about one call in 8 (by its clock's
    millisecond): a record older than the window that is still there must not hold a
    message id back, and one inside it must."""
    keys, window = broker.keys("default"), broker.dedupe_window
    now = server_ms(redis_client)
    redis_client.zadd(keys.sent, {"old": now - window - 1000, "stale": now - window - 1000, "recent": now - 1000})

    def enqueue(clock: int, *ids: str) -> list[int]:
        args = _enqueue_args(keys, [(i, b"{}") for i in ids], window, clock_ms=str(clock))
        return [int(x) for x in broker.redisson_scripts._run_resending("enqueue", _enqueue_keys(keys), args)]

    # When a call that does not trim (its clock's millisecond is not a multiple of 8)
    # sends the ids of a record older than the window and of one inside it
    clock = now - now % 8 + 1
    assert enqueue(clock, "old", "recent")[1:] == [1, 0]  # 1 pushed; no TIME read: 0
    # Then the first goes through, the second is a duplicate, and the old record of
    # another id is still there (not trimmed)
    assert redis_client.lrange(keys.ready, 0, -1) == [b"old"]
    assert redis_client.zscore(keys.sent, "stale") is not None
    assert redis_client.zscore(keys.sent, "old") == clock
    # And a call whose clock's millisecond is a multiple of 8 trims it
    enqueue(clock + 7, "another")
    assert redis_client.zscore(keys.sent, "stale") is None
    assert redis_client.zscore(keys.sent, "recent") is not None


def test_an_enqueue_reads_the_server_clock_once_per_estimate(broker: RedissonBroker) -> None:
    """Without a fresh estimate of the server's clock, an enqueue with a dedupe window
    reads TIME and returns it; the next ones take the estimate made from it (no TIME),
    until it is older than CLOCK_ESTIMATE_TTL."""
    keys, scripts = broker.keys("default"), broker.redisson_scripts
    scripts._clocks.clear()
    first = scripts.enqueue(keys, [("a", b"{}")], broker.dedupe_window)
    assert int(first[2]) > 0
    assert abs(int(scripts.server_now_ms("default")) - int(first[2])) < 1000
    assert int(scripts.enqueue(keys, [("b", b"{}")], broker.dedupe_window)[2]) == 0
    ms, _ = scripts._clocks["default"]
    scripts._clocks["default"] = (ms, time.monotonic() - CLOCK_ESTIMATE_TTL - 1)
    assert int(scripts.enqueue(keys, [("c", b"{}")], broker.dedupe_window)[2]) > 0
    # Without a window the clock is not read at all.
    scripts._clocks.clear()
    assert int(scripts.enqueue(keys, [("d", b"{}")], 0)[2]) == 0


def test_a_retry_from_the_retries_middleware_gets_a_fresh_redis_id(broker: RedissonBroker, make_worker: Any) -> None:
    attempts: list[str] = []
    broker.add_middleware(dramatiq.middleware.CurrentMessage())

    @dramatiq.actor(max_retries=1)
    def flaky() -> None:
        message = dramatiq.middleware.CurrentMessage.get_current_message()
        assert message is not None
        attempts.append(message.options["redis_message_id"])
        if len(attempts) == 1:
            raise dramatiq.Retry(delay=0)

    # Given a message retried immediately while its first copy is still in flight
    flaky.send()
    make_worker()
    # Then the retry runs (it is not taken for a duplicate), under a fresh redis id
    assert wait_for(lambda: len(attempts) == 2 and broker.pending("default") == 0)
    assert len(set(attempts)) == 2


def test_offering_the_same_prepared_message_twice_keeps_it_scheduled_once(
    broker: RedissonBroker, redis_client: redis.Redis
) -> None:
    @dramatiq.actor
    def noop() -> None: ...

    # Given a prepared delayed message offered (a call whose reply was lost)
    message, sort_key = broker.prepare_scheduled(noop.message())
    keys = broker.keys("default")
    entry = (60_000, sort_key, message.message_id, b"{}", "")
    broker.redisson_scripts.offer(keys, [entry])
    # When exactly the same call runs again, singly and in bulk
    broker.redisson_scripts.offer(keys, [entry])
    value = sort_key.encode() + b"{}"
    broker.redisson_scripts.offer_calls([(keys, ["bulk", 60_000, message.message_id, value], False)])
    # Then its member is scheduled once and listed once
    member = message.options["redis_message_id"].encode()
    assert redis_client.zrange(keys.timeout_zset, 0, -1) == [member]
    assert redis_client.lrange(keys.backup_list, 0, -1) == [member]


def test_offering_a_prepared_message_again_after_it_came_due_does_not_schedule_it_twice(
    broker: RedissonBroker, redis_client: redis.Redis
) -> None:
    @dramatiq.actor
    def noop() -> None: ...

    # Given a prepared message offered with a short delay, then moved to the ready queue
    message, sort_key = broker.prepare_scheduled(noop.message())
    keys = broker.keys("default")
    entry = (1, sort_key, message.message_id, message.encode(), "")
    broker.redisson_scripts.offer(keys, [entry])
    assert wait_for(
        lambda: (
            broker.redisson_scripts.transfer(keys, limit=10, trim_budget=10, compact_step=10, compact_slack=10).moved
            == 1
        )
    )
    # When the same call runs again (a client's retry after the reply was lost)
    assert broker.redisson_scripts.offer(keys, [entry]) == [-2]
    # Then it is not scheduled again: the copy on the ready queue is the only one
    member = message.options["redis_message_id"].encode()
    assert redis_client.zcard(keys.timeout_zset) == 0
    assert redis_client.lrange(keys.ready, 0, -1) == [member]


@pytest.mark.parametrize("look", ["sent", "ready", "both"])
def test_the_one_message_offer_sent_again_after_its_member_came_due_does_not_schedule_it_twice(
    broker: RedissonBroker, redis_client: redis.Redis, look: str
) -> None:
    @dramatiq.actor
    def noop() -> None: ...

    # Given a prepared message offered with the one-message offer, the same call repeated
    # while it is scheduled (it stays scheduled once), then moved to the ready queue
    message, sort_key = broker.prepare_scheduled(noop.message())
    keys, scripts = broker.keys("default"), broker.redisson_scripts
    call = (keys, 1, sort_key, message.message_id, message.encode(), look)
    assert scripts.offer_one(*call) > 0
    assert scripts.offer_one(*call) > 0
    member = message.options["redis_message_id"].encode()
    assert redis_client.lrange(keys.backup_list, 0, -1) == [member]
    window = 0 if look == "ready" else 60_000

    def moved() -> bool:
        result = scripts.transfer(keys, limit=10, trim_budget=10, compact_step=10, compact_slack=10, window_ms=window)
        return result.moved == 1

    assert wait_for(moved)
    # When the same call runs again: while it is on the ready queue, and (with a dedupe
    # window) after it ran and was acked
    assert scripts.offer_one(*call) == -2
    if look != "ready":
        assert scripts.fetch(keys, "w1", 1)[0][0] == member.decode()
        assert scripts.ack(keys, "w1", member.decode()) == 1
        assert scripts.offer_one(*call) == -2
    # Then it was never scheduled a second time
    assert redis_client.zcard(keys.timeout_zset) == 0
    assert redis_client.hlen(keys.payloads) == 0


def test_a_send_delayed_past_every_retry_of_the_client_skips_the_lookup_and_stays_scheduled_once(
    broker: RedissonBroker, redis_client: redis.Redis, redis_url: str
) -> None:
    @dramatiq.actor
    def noop() -> None: ...

    # The broker's own client retries nothing (span 0): a send delayed by more than the
    # margin cannot have come due before a resend of its call, so it looks nowhere
    assert broker.client_retry_span == 0
    producer = broker.producer
    assert producer._resend_lookup(RESEND_MARGIN_MS + 1) == ""
    assert producer._resend_lookup(RESEND_MARGIN_MS) == broker.resend_lookup == "sent"
    # And that call sent again (a resend) keeps the message scheduled once, due later
    message, sort_key = broker.prepare_scheduled(noop.message())
    keys, scripts = broker.keys("default"), broker.redisson_scripts
    call = (keys, 60_000, sort_key, message.message_id, message.encode(), "")
    first = scripts.offer_one(*call)
    assert scripts.offer_one(*call) >= first
    assert redis_client.zcard(keys.timeout_zset) == 1 and redis_client.llen(keys.backup_list) == 1
    # A client whose retries have no bound always looks, wherever the window says
    unbounded = RedissonBroker(client=redis.Redis.from_url(redis_url, retry=Retry(NoBackoff(), -1)))
    try:
        assert unbounded.client_retry_span is None
        assert unbounded.producer._resend_lookup(3_600_000) == "both"
    finally:
        unbounded.close()


def test_the_one_message_offer_leaves_a_reschedule_to_the_full_offer(
    broker: RedissonBroker, redis_client: redis.Redis
) -> None:
    @dramatiq.actor
    def noop() -> None: ...

    # Given a message scheduled holding a dedupe key
    keys, scripts = broker.keys("default"), broker.redisson_scripts
    first = broker.enqueue(noop.message_with_options(dedupe_key="k"), delay=60_000)
    assert redis_client.hget(keys.dedupe, "k") == first.message_id.encode()
    # When the one-message offer is given the same message id under a new member
    unkeyed = Message(
        queue_name=first.queue_name,
        actor_name=first.actor_name,
        args=(),
        kwargs={},
        options={},
        message_id=first.message_id,
    )
    again, sort_key = broker.prepare_scheduled(unkeyed)
    assert scripts.offer_one(keys, 120_000, sort_key, again.message_id, again.encode(), "sent") == -4
    # Then it wrote nothing; and a send of it without the key reschedules it through the
    # full offer, which releases the key
    old_member = first.options["redis_message_id"].encode()
    assert redis_client.zrange(keys.timeout_zset, 0, -1) == [old_member]
    rescheduled = broker.enqueue(unkeyed, delay=120_000)
    new_member = rescheduled.options["redis_message_id"].encode()
    assert new_member != old_member
    assert redis_client.zrange(keys.timeout_zset, 0, -1) == [new_member]
    assert redis_client.hget(keys.dedupe, "k") is None and redis_client.hlen(keys.keyed) == 0


def test_the_one_message_offer_announces_only_a_new_earliest_due_time(
    broker: RedissonBroker, redis_client: redis.Redis
) -> None:
    @dramatiq.actor
    def noop() -> None: ...

    keys = broker.keys("default")
    pubsub = redis_client.pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(keys.channel)
    assert wait_for(lambda: redis_client.pubsub_numsub(keys.channel)[0][1] == 1)
    # Given an empty queue: a first message is announced
    a = broker.enqueue(noop.message(), delay=60_000)
    # A later one is not; an earlier one is
    broker.enqueue(noop.message(), delay=120_000)
    c = broker.enqueue(noop.message(), delay=30_000)
    announced = []
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:
        got = pubsub.get_message(timeout=0.1)
        if got is not None:
            announced.append(int(got["data"]))
    pubsub.close()
    assert announced == [a.options["eta"], c.options["eta"]]


@pytest.mark.parametrize("window_ms", [120_000, 0])
def test_offering_a_prepared_message_again_after_it_ran_schedules_it_only_outside_the_window(
    broker: RedissonBroker, redis_client: redis.Redis, window_ms: int
) -> None:
    """A resend that comes after the message moved, ran and was acked (a retry's
    re-enqueue sent again after NotReplicated, which can last seconds) is recognised
    within the dedupe window: the transfer remembered the member."""

    @dramatiq.actor
    def noop() -> None: ...

    message, sort_key = broker.prepare_scheduled(noop.message())
    keys = broker.keys("default")
    entry = (1, sort_key, message.message_id, message.encode(), "")
    broker.redisson_scripts.offer(keys, [entry])

    def moved() -> bool:
        result = broker.redisson_scripts.transfer(
            keys, limit=10, trim_budget=10, compact_step=10, compact_slack=10, window_ms=window_ms
        )
        return result.moved == 1

    assert wait_for(moved)
    member = message.options["redis_message_id"]
    # It runs and is acked: nothing of it is left on the ready queue.
    assert broker.redisson_scripts.fetch(keys, "w1", 1)[0][0] == member
    assert broker.redisson_scripts.ack(keys, "w1", member) == 1
    again = broker.redisson_scripts.offer(keys, [entry])
    if window_ms:
        assert again == [-2] and redis_client.zcard(keys.timeout_zset) == 0
        assert 0 < redis_client.pttl(keys.sent) <= window_ms
    else:  # nothing remembered: scheduled again (what the window is for)
        assert again[0] > 0 and redis_client.zcard(keys.timeout_zset) == 1


# -- a full server -------------------------------------------------------------------------


@pytest.mark.parametrize("delay", [60_000, None])
def test_a_full_server_refuses_sends_whole_with_a_clear_error(
    broker: RedissonBroker, memory_limit: redis.Redis, delay: int | None
) -> None:
    @dramatiq.actor
    def noop(i: int) -> None: ...

    # Given messages already there (a re-offer takes the reschedule path), then a full server
    earlier = broker.enqueue_many([noop.message(i) for i in range(3)], delay=delay)
    fill_to_maxmemory(memory_limit)
    before = _keys_snapshot(memory_limit)
    # When a new message, a message already scheduled (with another delay) and a batch are sent
    attempts = [
        lambda: broker.enqueue(noop.message(10), delay=delay),
        lambda: broker.enqueue(earlier[0], delay=delay and delay * 2),
        lambda: broker.enqueue_many([noop.message(i) for i in range(2 * BULK_CHUNK_SIZE)], delay=delay),
    ]
    if not delay:
        attempts.pop(1)  # an immediate message already queued is not written again (below)
    for attempt in attempts:
        with pytest.raises(ServerMemoryFull, match=r"'default'.*maxmemory") as raised:
            attempt()
        assert isinstance(raised.value.__cause__, redis.exceptions.OutOfMemoryError)
        assert raised.value.enqueued == [] and raised.value.failed
    # Then nothing was written
    assert _keys_snapshot(memory_limit) == before
    if not delay:
        # And an immediate message sent again while queued is accepted without a write
        broker.enqueue(earlier[0])
        assert _keys_snapshot(memory_limit) == before


@pytest.mark.parametrize("delay", [60_000, 0])
def test_on_a_full_server_a_retry_takes_the_place_of_its_copy_in_flight(
    broker: RedissonBroker, memory_limit: redis.Redis, delay: int
) -> None:
    @dramatiq.actor
    def noop(i: int) -> None: ...

    # Given a message fetched by a worker (in flight), then a full server
    keys = broker.keys("default")
    noop.send(1)
    [(redis_id, data)] = broker.redisson_scripts.fetch(keys, broker.broker_id, 1)
    assert data is not None
    proxy = MessageProxy(Message.decode(data))
    fill_to_maxmemory(memory_limit)
    # When the Retries middleware re-enqueues it (a plain new message is still refused)
    with pytest.raises(ServerMemoryFull):
        broker.enqueue(noop.message(2), delay=delay)
    proxy.options["retries"] = 1
    retry = broker.enqueue(proxy, delay=delay)
    # Then the retry is enqueued, in place of the in-flight copy's payload
    assert not memory_limit.hexists(keys.ready_msgs, redis_id)
    if delay:
        assert _scheduled_ids(broker) == [proxy.message_id]
    else:
        assert _ready_ids(broker) == [retry.options["redis_message_id"]] != [redis_id]
    # And the worker's ack that follows completes the move
    assert broker.do_ack("default", redis_id) == 1
    assert memory_limit.scard(keys.acks(broker.broker_id)) == 0


OFFER_STRUCTURES = ("timeout_zset", "backup_list", "payloads", "dedupe", "keyed", "holds", "throttle_copies")


@pytest.mark.parametrize("structure", OFFER_STRUCTURES)
@pytest.mark.parametrize("send", ["plain", "keyed", "reschedule", "bulk"])
def test_a_delayed_structure_of_the_wrong_type_fails_the_send_and_writes_nothing(
    broker: RedissonBroker, structure: str, send: str
) -> None:
    @dramatiq.actor
    def noop(i: int) -> None: ...

    keys = broker.keys("default")
    client = broker.client
    earlier = None
    if send == "reschedule":
        earlier = broker.enqueue(noop.message(1), delay=60_000)
    # Given one of the delayed queue's keys holding a string
    client.delete(getattr(keys, structure))
    client.set(getattr(keys, structure), "not mine")
    before = {name: client.dump(getattr(keys, name)) for name in OFFER_STRUCTURES}
    # When a delayed send touches the queue
    options: dict[str, Any] = {"dedupe_key": "k"} if send == "keyed" else {}
    try:
        if send == "bulk":
            broker.enqueue_many([noop.message(i) for i in range(3)], delay=60_000)
        elif send == "reschedule":
            assert earlier is not None
            broker.enqueue(earlier.copy(options={}), delay=120_000)
        else:
            broker.enqueue(noop.message_with_options(args=(1,), **options), delay=60_000)
    except (redis.ResponseError, EnqueueError) as error:
        assert "WRONGTYPE" in str(error)
    # Then (if it failed) nothing was written; only paths that never touch the key succeed
    after = {name: client.dump(getattr(keys, name)) for name in OFFER_STRUCTURES}
    if after != before:
        touched = {"timeout_zset", "backup_list", "payloads"}
        if send == "keyed" or send == "reschedule":
            touched |= {"dedupe", "keyed"}
        assert structure not in touched, (structure, send)
