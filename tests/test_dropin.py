"""Drop-in: same constructor, same ready-queue layout, works with the dramatiq CLI."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import dramatiq
import pytest
import redis
from dramatiq import Worker
from dramatiq.brokers.redis import RedisBroker

from dramatiq_redisson import RedissonBroker
from tests.helpers import record, records, wait_for


def test_constructor_accepts_everything_the_builtin_broker_accepts(
    redis_url: str, redis_client: redis.Redis, make_broker: Callable[..., Any]
) -> None:
    kwargs = redis_client.connection_pool.connection_kwargs
    by_params = make_broker(host=kwargs["host"], port=kwargs["port"], db=0, socket_timeout=5)
    by_client = make_broker(
        client=redis_client,
        namespace="ns",
        middleware=[],
        heartbeat_timeout=30_000,
        dead_message_ttl=60_000,
        maintenance_chance=0,
    )
    by_url = make_broker(url=redis_url)
    for broker in (by_params, by_client, by_url):
        assert isinstance(broker, RedisBroker)
        assert broker.client.ping()
    assert by_client.namespace == "ns" and by_client.heartbeat_timeout == 30_000
    assert by_client.dead_message_ttl == 60_000 and by_client.middleware == []


def test_namespace_prefixes_every_key(
    redis_url: str, redis_client: redis.Redis, make_broker: Callable[..., Any]
) -> None:
    broker = make_broker(url=redis_url, namespace="shop")
    dramatiq.set_broker(broker)

    @dramatiq.actor(queue_name="mail")
    def send_mail() -> None: ...

    send_mail.send()
    send_mail.send_with_options(delay=10_000)
    assert set(redis_client.keys("*")) == {
        b"shop:mail",
        b"shop:mail.msgs",
        b"redisson_delay_queue_timeout:{shop:mail}",
        b"redisson_delay_queue:{shop:mail}",
        b"redisson_delay_queue_msgs:{shop:mail}",
        b"redisson_delay_queue_sent:{shop:mail}",
        b"shop:__queues__",
    }


def test_immediate_messages_keep_the_builtin_layout_both_ways(
    redis_url: str, redis_client: redis.Redis, make_broker: Callable[..., Any]
) -> None:
    # Given a built-in broker and ours on the same Redis, each with the same actor
    builtin = make_broker(RedisBroker, url=redis_url)
    ours = make_broker(url=redis_url)

    def declare(broker: RedisBroker) -> dramatiq.Actor:  # type: ignore[type-arg]
        @dramatiq.actor(broker=broker, actor_name="shared")
        def shared(origin: str) -> None:
            record(redis_client, origin=origin, consumer=type(broker).__name__)

        return shared

    from_builtin, from_ours = declare(builtin), declare(ours)
    # When each side sends to the other's workers
    from_builtin.send("builtin")
    worker = Worker(ours, worker_timeout=100)
    worker.start()
    assert wait_for(lambda: len(records(redis_client)) == 1)
    worker.stop()
    from_ours.send("ours")
    worker = Worker(builtin, worker_timeout=100)
    worker.start()
    assert wait_for(lambda: len(records(redis_client)) == 2)
    worker.stop()
    # Then both ran, each on the other broker's worker
    assert [(r["origin"], r["consumer"]) for r in records(redis_client)] == [
        ("builtin", "RedissonBroker"),
        ("ours", "RedisBroker"),
    ]


def test_dramatiq_cli_runs_an_app_module_with_delays(
    redis_url: str, redis_client: redis.Redis, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given an app module written for the built-in broker, switched by config only
    (tmp_path / "cliapp.py").write_text(
        textwrap.dedent(
            """
            import os, time, dramatiq, redis
            from dramatiq_redisson import RedissonBroker

            broker = RedissonBroker(url=os.environ["REDIS_URL"])
            dramatiq.set_broker(broker)
            client = redis.Redis.from_url(os.environ["REDIS_URL"])

            @dramatiq.actor
            def hello(i):
                client.rpush("cli:done", i)
            """
        )
    )
    env = {**os.environ, "REDIS_URL": redis_url, "PYTHONPATH": str(tmp_path)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "dramatiq", "cliapp:broker", "--processes", "1", "--threads", "2"],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        monkeypatch.setenv("REDIS_URL", redis_url)
        sys.path.insert(0, str(tmp_path))
        import cliapp  # type: ignore[import-not-found]

        cliapp.hello.send(0)
        cliapp.hello.send_with_options(args=(1,), delay=500)
        assert wait_for(lambda: redis_client.llen("cli:done") == 2, timeout=20)
        # (Both may run at once: a worker that boots after the delay fetches them together.)
        assert sorted(redis_client.lrange("cli:done", 0, -1)) == [b"0", b"1"]
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("cliapp", None)
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 0, stderr.decode()[-2000:]


@pytest.mark.parametrize("delay", [None, 0])
def test_no_delay_and_zero_delay_go_straight_to_the_ready_queue(
    broker: RedissonBroker, redis_client: redis.Redis, delay: int | None
) -> None:
    @dramatiq.actor
    def noop() -> None: ...

    message = noop.send_with_options(delay=delay)
    assert redis_client.lrange("dramatiq:default", 0, -1) == [message.options["redis_message_id"].encode()]
    assert broker.delayed_queue("default").size() == 0


def test_enqueue_many_mixes_queues_and_runs_middleware_hooks(broker: RedissonBroker, redis_client: redis.Redis) -> None:
    @dramatiq.actor(queue_name="a")
    def a(i: int) -> None: ...

    @dramatiq.actor(queue_name="b")
    def b(i: int) -> None: ...

    seen: list[str] = []

    class Spy(dramatiq.Middleware):
        def after_enqueue(self, broker: dramatiq.Broker, message: dramatiq.Message, delay: int | None) -> None:  # type: ignore[type-arg]
            seen.append(message.queue_name)

    broker.add_middleware(Spy())
    messages = [a.message(i) for i in range(700)] + [b.message(i) for i in range(3)]
    broker.enqueue_many(messages, delay=60_000)
    assert broker.delayed_queue("a").size() == 700 and broker.delayed_queue("b").size() == 3
    assert len(seen) == 703
    broker.enqueue_many([a.message(1), b.message(2)])
    assert redis_client.llen("dramatiq:a") == 1 and redis_client.llen("dramatiq:b") == 1


def test_a_process_that_only_sends_starts_no_timer(
    redis_url: str, redis_client: redis.Redis, make_broker: Callable[..., Any]
) -> None:
    import threading

    threads = set(threading.enumerate())
    broker = make_broker(url=redis_url)

    @dramatiq.actor(broker=broker)
    def noop() -> None: ...

    noop.send_with_options(delay=1_000)
    noop.send()
    assert set(threading.enumerate()) == threads
    assert redis_client.pubsub_numsub("redisson_delay_queue_channel:{dramatiq:default}") == [
        (b"redisson_delay_queue_channel:{dramatiq:default}", 0)
    ]
