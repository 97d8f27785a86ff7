"""Script calls on the runner's own connections (dramatiq_redisson.scripts._direct_calls): which
clients get them, and that they behave as the client's own path would: retried after a
killed connection, a flushed script cache answered, connections bounded by the calls in
flight, a forked child on connections of its own, all closed with the broker."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator

import dramatiq
import pytest
import redis

from dramatiq_redisson import RedissonBroker
from dramatiq_redisson.scripts._direct_calls import DirectCalls
from tests.helpers import wait_for

#: A command that answers with the connection it ran on, so that a test can tell which
#: connection a call used (a script may not run CLIENT; the path is the same).
WHO = ("CLIENT", "ID")
#: A script to call.
SCRIPT = "return 7"


@pytest.fixture
def calls(redis_url: str) -> Iterator[tuple[DirectCalls, str, redis.Redis]]:
    client = redis.Redis.from_url(redis_url)
    direct = DirectCalls(client)
    sha = client.script_load(SCRIPT)
    yield direct, sha, client
    direct.close()
    client.close()


def test_plain_clients_only(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    single = redis.Redis.from_url(redis_url, single_connection_client=True)
    try:
        assert DirectCalls.suits(client)
        assert not DirectCalls.suits(client.pipeline())
        assert not DirectCalls.suits(single)
        assert not DirectCalls.suits(object())
    finally:
        single.close()
        client.close()


def test_one_connection_serves_a_thread_that_calls_again(calls: tuple[DirectCalls, str, redis.Redis]) -> None:
    direct, sha, _ = calls
    assert direct.call("EVALSHA", sha, 0) == 7
    first = direct.call(*WHO)
    assert [direct.call(*WHO) for _ in range(5)] == [first] * 5
    assert len(direct.made) == 1


def test_an_error_reply_keeps_the_connection(calls: tuple[DirectCalls, str, redis.Redis]) -> None:
    direct, sha, _ = calls
    first = direct.call(*WHO)
    with pytest.raises(redis.ResponseError, match="boom"):
        direct.call("EVAL", "return redis.error_reply('boom')", 0)
    with pytest.raises(redis.exceptions.NoScriptError):
        direct.call("EVALSHA", "0" * 40, 0)
    assert direct.call(*WHO) == first


def test_a_killed_connection_is_retried_on_a_new_one(redis_url: str) -> None:
    """CLIENT KILL between two calls: the second still answers (the client's Retry,
    reconnecting), from a new connection."""
    client = redis.Redis.from_url(redis_url, retry=redis.retry.Retry(redis.backoff.NoBackoff(), 3))
    direct = DirectCalls(client)
    try:
        first = direct.call(*WHO)
        assert client.client_kill_filter(_id=first) == 1
        second = direct.call(*WHO)
        assert second != first
        assert len(direct.made) == 1  # the same Connection object, connected again
    finally:
        direct.close()
        client.close()


def test_without_retries_a_killed_connection_raises_and_the_next_call_reconnects(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url, retry=redis.retry.Retry(redis.backoff.NoBackoff(), 0))
    direct = DirectCalls(client)
    try:
        first = direct.call(*WHO)
        client.client_kill_filter(_id=first)
        with pytest.raises(redis.ConnectionError):
            direct.call(*WHO)
        assert direct.call(*WHO) != first
    finally:
        direct.close()
        client.close()


def test_connections_are_bounded_by_the_calls_in_flight(calls: tuple[DirectCalls, str, redis.Redis]) -> None:
    """Forty short-lived threads, four at a time: at most four connections are made, not
    one per thread that ever called."""
    direct, sha, _ = calls
    gate = threading.Semaphore(4)
    errors: list[BaseException] = []

    def one() -> None:
        with gate:
            try:
                for _ in range(20):
                    assert direct.call("EVALSHA", sha, 0) == 7
            except BaseException as e:  # pragma: no cover - reported below
                errors.append(e)

    threads = [threading.Thread(target=one) for _ in range(40)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert 1 <= len(direct.made) <= 4
    assert len(direct.idle) == len(direct.made)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_uses_connections_of_its_own(calls: tuple[DirectCalls, str, redis.Redis]) -> None:
    direct, sha, client = calls
    parent = direct.call(*WHO)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through the pipe
        try:
            child = direct.call(*WHO)
            os.write(write, str(child).encode())
        finally:
            os._exit(0)
    os.close(write)
    child = int(os.read(read, 64).decode())
    os.close(read)
    os.waitpid(pid, 0)
    assert child != parent
    assert direct.call(*WHO) == parent  # the parent's connection is intact


def test_the_broker_runs_its_scripts_on_them_and_closes_them(redis_url: str, redis_client: redis.Redis) -> None:
    broker = RedissonBroker(url=redis_url)
    direct = broker.redisson_scripts.direct
    assert direct is not None

    @dramatiq.actor(broker=broker, queue_name="direct")
    def job() -> None:
        pass

    job.send_with_options(delay=60_000)  # the offer script
    assert len(direct.made) == 1
    mine = direct.call(*WHO)
    broker.close()
    # The server drops a closed connection when it reads the close: soon, not at once.
    assert wait_for(lambda: mine not in {int(c["id"]) for c in redis_client.client_list()}, timeout=5)


def test_a_flushed_script_cache_is_answered(redis_url: str, redis_client: redis.Redis) -> None:
    """SCRIPT FLUSH between calls (a server restart without persistence does the same):
    the offer (EVAL with its source) and the consumer's scripts (loaded again) go on."""

    broker = RedissonBroker(url=redis_url)
    try:

        @dramatiq.actor(broker=broker, queue_name="flushed")
        def job() -> None:
            pass

        job.send_with_options(delay=60_000)
        redis_client.script_flush()
        job.send_with_options(delay=60_000)
        redis_client.script_flush()
        keys = broker.keys("flushed")
        assert broker.redisson_scripts.fetch(keys, broker.broker_id, 1, "", "t") == []
        assert redis_client.zcard(keys.timeout_zset) == 2
    finally:
        broker.flush_all()
        broker.close()
