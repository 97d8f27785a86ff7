"""What middleware watching enqueues sees, side by side with Dramatiq's built-in broker:
the same hooks with the same arguments, and for a delayed message an ``eta`` option
(before the send: now + delay; after it: the due time the server stored)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import dramatiq
import pytest
import redis
from dramatiq import Worker, pipeline
from dramatiq.brokers.redis import RedisBroker
from dramatiq.middleware import Middleware

from dramatiq_redisson import RedissonBroker
from tests.helpers import wait_for


class Recorder(Middleware):
    """Records every enqueue hook: (hook, actor, queue without .DQ, eta or None, delay)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, str, int | None, Any]] = []
        #: The message id of each call (same order).
        self.message_ids: list[str] = []
        #: The thread that made each call (same order).
        self.threads: list[int] = []

    def _record(self, hook: str, message: Any, delay: Any) -> None:
        queue = message.queue_name.removesuffix(".DQ")
        self.calls.append((hook, message.actor_name, queue, message.options.get("eta"), delay))
        self.message_ids.append(message.message_id)
        self.threads.append(threading.get_ident())

    def before_enqueue(self, broker: Any, message: Any, delay: Any) -> None:
        self._record("before", message, delay)

    def after_enqueue(self, broker: Any, message: Any, delay: Any) -> None:
        self._record("after", message, delay)


Case = tuple[Any, Recorder, dict[str, Any]]


@pytest.fixture(params=["redisson", "builtin"])
def case(request: pytest.FixtureRequest, redis_url: str, redis_client: redis.Redis) -> Iterator[Case]:
    """A broker of either kind with a Recorder, its actors and a running Worker."""
    recorder = Recorder()
    broker: Any
    if request.param == "redisson":
        broker = RedissonBroker(url=redis_url)
    else:
        broker = RedisBroker(url=redis_url, namespace="builtin")
    broker.add_middleware(recorder)  # after the defaults (Retries, Pipelines, ...)
    dramatiq.set_broker(broker)
    failed_once: set[int] = set()

    @dramatiq.actor(broker=broker)
    def step(i: int) -> None: ...

    @dramatiq.actor(broker=broker, max_retries=1, min_backoff=200, max_backoff=200)
    def flaky(i: int) -> None:
        if i not in failed_once:
            failed_once.add(i)
            raise RuntimeError("fails once")
        redis_client.rpush("test:flaky", i)

    worker = Worker(broker, worker_timeout=100, worker_threads=2)
    worker.start()
    yield broker, recorder, {"step": step, "flaky": flaky}
    worker.stop()
    broker.flush_all()
    broker.close() if isinstance(broker, RedissonBroker) else broker.client.connection_pool.disconnect()


def hooks_of(recorder: Recorder, actor: str, *, here: bool | None = None) -> list[tuple[str, str, bool, Any]]:
    """The shape of the calls for one actor: hook, queue, whether an eta was given, delay
    (``here``: only the calls of this thread, or only those of other threads)."""
    me = threading.get_ident()
    return [
        (hook, queue, eta is not None, delay)
        for (hook, name, queue, eta, delay), thread in zip(recorder.calls, recorder.threads, strict=True)
        if name == actor and (here is None or (thread == me) == here)
    ]


def test_immediate_and_delayed_sends_show_the_same_hooks(case: Case) -> None:
    broker, recorder, actors = case
    actors["step"].send(1)
    t0 = int(time.time() * 1000)
    message = actors["step"].send_with_options(args=(2,), delay=60_000)
    t1 = int(time.time() * 1000)
    assert hooks_of(recorder, "step") == [
        ("before", "default", False, None),
        ("after", "default", False, None),
        ("before", "default", True, 60_000),
        ("after", "default", True, 60_000),
    ]
    before_eta, after_eta = recorder.calls[2][3], recorder.calls[3][3]
    assert before_eta is not None and t0 + 60_000 <= before_eta <= t1 + 60_000
    assert after_eta is not None and abs(after_eta - before_eta) <= 50
    assert message.options["eta"] == after_eta
    if isinstance(broker, RedissonBroker):
        # Ours: the queue name stays canonical, and eta is what the ZSET holds
        assert message.queue_name == "default"
        member = message.options["redis_message_id"]
        assert broker.client.zscore(broker.keys("default").timeout_zset, member) == after_eta


def test_a_retry_shows_the_same_hooks(case: Case, redis_client: redis.Redis) -> None:
    broker, recorder, actors = case
    actors["flaky"].send(7)
    assert wait_for(lambda: redis_client.lrange("test:flaky", 0, -1) == [b"7"], timeout=10)
    # The send (this thread), then the retry Retries enqueued with its back-off (as a
    # delayed message), from a worker thread: a fast worker may record it before this
    # thread records the send's after hook, so each thread's calls are compared apart.
    assert hooks_of(recorder, "flaky", here=True) == [
        ("before", "default", False, None),
        ("after", "default", False, None),
    ]
    shape = [("send", "", False, None)] * 2 + hooks_of(recorder, "flaky", here=False)
    assert [(hook, queue, has_eta) for hook, queue, has_eta, _ in shape[2:4]] == [
        ("before", "default", True),
        ("after", "default", True),
    ]
    assert all(isinstance(delay, int) and delay > 0 for *_, delay in shape[2:4])
    if isinstance(broker, RedissonBroker):
        # The transfer moves the due retry on the server: no further hook
        assert len(shape) == 4
    else:
        # The built-in worker re-enqueues the due message from .DQ itself, through the
        # hooks again (without eta): a difference the README's migration notes name
        assert shape[4:] == [("before", "default", False, None), ("after", "default", False, None)]


def test_a_pipeline_shows_the_same_hooks(case: Case) -> None:
    broker, recorder, actors = case
    step = actors["step"]
    # The second goes out (from the worker) after the first ran
    pipeline([step.message_with_options(args=(i,), pipe_ignore=True) for i in (1, 2)]).run()
    assert wait_for(lambda: len(hooks_of(recorder, "step")) == 4, timeout=10)
    # Each send shows before, then after. (The second send, from a worker thread, may
    # begin before the first send's after hook ran in this thread: a fast worker, on
    # either broker, runs the first message that soon.)
    per_message: dict[str, list[tuple[str, str, bool, Any]]] = {}
    for call, message_id in zip(recorder.calls, recorder.message_ids, strict=True):
        hook, name, queue, eta, delay = call
        if name == "step":
            per_message.setdefault(message_id, []).append((hook, queue, eta is not None, delay))
    assert list(per_message.values()) == [[("before", "default", False, None), ("after", "default", False, None)]] * 2


def test_enqueue_many_gives_each_delayed_message_its_stored_due_time(
    broker: RedissonBroker, redis_client: redis.Redis
) -> None:
    recorder = Recorder()
    broker.add_middleware(recorder)

    @dramatiq.actor
    def step(i: int) -> None: ...

    t0 = int(time.time() * 1000)
    messages = broker.enqueue_many([step.message(i) for i in range(250)], delay=30_000)
    t1 = int(time.time() * 1000)
    keys = broker.keys("default")
    befores = [eta for hook, _, _, eta, _ in recorder.calls if hook == "before"]
    afters = [eta for hook, _, _, eta, _ in recorder.calls if hook == "after"]
    assert len(befores) == len(afters) == 250
    assert all(eta is not None and t0 + 30_000 <= eta <= t1 + 30_000 for eta in befores)
    for message, eta in zip(messages, afters, strict=True):
        assert message.options["eta"] == eta
        assert redis_client.zscore(keys.timeout_zset, message.options["redis_message_id"]) == eta
        stored = redis_client.hget(keys.payloads, message.message_id)
        assert stored is not None and b'"eta"' not in stored
    # Immediate messages get none, as with the built-in broker
    assert all("eta" not in m.options for m in broker.enqueue_many([step.message(1)]))


def test_a_transferred_message_carries_no_eta(broker: RedissonBroker, redis_client: redis.Redis) -> None:
    seen: list[Any] = []

    @dramatiq.actor
    def step() -> None: ...

    step.send_with_options(delay=1)
    consumer = broker.consume("default", prefetch=1, timeout=50)
    assert wait_for(lambda: bool(seen.append(next(consumer)) or [m for m in seen if m is not None]))
    (message,) = [m for m in seen if m is not None]
    assert "eta" not in message.options
    consumer.close()
