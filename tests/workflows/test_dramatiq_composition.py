"""Dramatiq's own composition (``pipeline``, ``group`` with ``add_completion_callback``
and the ``GroupCallbacks`` middleware, results through ``Results``) works on this broker
as on the built-in one: the same scenario runs on both, side by side, on one server, and
ends the same way."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import dramatiq
import pytest
import redis
from dramatiq import Worker
from dramatiq.brokers.redis import RedisBroker
from dramatiq.middleware import default_middleware
from dramatiq.rate_limits.backends import RedisBackend as RateLimitBackend
from dramatiq.results import Results
from dramatiq.results.backends import RedisBackend as ResultBackend

from dramatiq_redisson import RedissonBroker
from tests.helpers import wait_for


@pytest.fixture(params=[RedissonBroker, RedisBroker], ids=["redisson", "builtin"])
def composing(request: pytest.FixtureRequest, redis_url: str, redis_client: redis.Redis) -> Iterator[Any]:
    namespace = "compose-" + request.param.__name__.lower()
    broker = request.param(url=redis_url, namespace=namespace, middleware=[m() for m in default_middleware])
    broker.add_middleware(dramatiq.middleware.GroupCallbacks(RateLimitBackend(client=redis_client)))
    broker.add_middleware(Results(backend=ResultBackend(client=redis_client, namespace=namespace + "-results")))
    dramatiq.set_broker(broker)
    yield broker
    broker.client.close()


def _scenario(broker: Any) -> tuple[list[Any], list[int], list[str]]:
    lock = threading.Lock()
    completed: list[str] = []
    seen: list[int] = []

    @dramatiq.actor(store_results=True, max_retries=0)
    def inc(x: int) -> int:
        with lock:
            seen.append(x)
        return x + 1

    @dramatiq.actor(max_retries=0)
    def done(tag: str) -> None:
        with lock:
            completed.append(tag)

    @dramatiq.actor(max_retries=0)
    def crash(x: int) -> None:
        raise RuntimeError("member failed")

    worker = Worker(broker, worker_timeout=100, worker_threads=4)
    worker.start()
    try:
        pipe = dramatiq.pipeline([inc.message(1), inc.message(), inc.message()])
        pipe.run()
        results = [pipe.get_result(block=True, timeout=10_000)]
        g = dramatiq.group([inc.message(i) for i in range(5)])
        g.add_completion_callback(done.message("all ran"))
        g.run()
        results.append(sorted(g.get_results(block=True, timeout=10_000)))
        assert wait_for(lambda: completed == ["all ran"], timeout=10), completed
        # Dramatiq's barrier counts successes only: a failed member means no callback.
        failing = dramatiq.group([inc.message(100), crash.message(0)])
        failing.add_completion_callback(done.message("never"))
        failing.run()
        assert wait_for(lambda: 100 in seen, timeout=10)
        broker.join(inc.queue_name, timeout=10_000)
    finally:
        worker.stop()
    return results, sorted(seen), completed


def test_pipeline_group_and_completion_callbacks_behave_as_on_the_built_in_broker(composing: Any) -> None:
    results, seen, completed = _scenario(composing)
    assert results == [4, [1, 2, 3, 4, 5]]
    assert seen == sorted([1, 2, 3, *range(5), 100])
    assert completed == ["all ran"]  # not "never": as on the built-in broker


def test_both_brokers_end_the_same_way(redis_url: str, redis_client: redis.Redis) -> None:
    outcomes: dict[str, Any] = {}
    make: dict[str, Callable[..., Any]] = {"redisson": RedissonBroker, "builtin": RedisBroker}
    for name, cls in make.items():
        broker = cls(url=redis_url, namespace=f"same-{name}", middleware=[m() for m in default_middleware])
        broker.add_middleware(dramatiq.middleware.GroupCallbacks(RateLimitBackend(client=redis_client)))
        broker.add_middleware(Results(backend=ResultBackend(client=redis_client, namespace=f"same-{name}-r")))
        dramatiq.set_broker(broker)
        try:
            outcomes[name] = _scenario(broker)
        finally:
            broker.client.close()
    assert outcomes["redisson"] == outcomes["builtin"]
