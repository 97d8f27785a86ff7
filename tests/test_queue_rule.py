"""One rule for a queue name the broker does not know (issue 47): every operations call
that names a queue, in the API and on the command line, refuses it (``ValueError``; exit 2
with one line on stderr naming it and listing the known queues) and writes nothing; a
queue declared here, or listed in the namespace's queue registry (sent to or consumed),
is known."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from typing import Any

import pytest
import redis
from dramatiq import Actor

from dramatiq_redisson import RedissonBroker
from dramatiq_redisson._keys import registry_key
from tests.cli.test_cli import assert_one_line_error, cli_runner

#: A name no queue has, and what every refusal of it says.
NOPE = "nope"
REFUSED = f"unknown queue {NOPE!r}"


def keyspace(client: redis.Redis) -> dict[bytes, bytes | None]:
    """Every key with its serialized value: equal before and after means nothing was written."""
    return {key: client.dump(key) for key in sorted(client.keys("*"))}


@pytest.fixture
def known(broker: RedissonBroker, actors: tuple[Actor[..., None], Actor[..., None]]) -> RedissonBroker:
    """A broker whose one known queue, ``default``, has a scheduled message and a dead letter."""
    alpha, _ = actors
    alpha.send_with_options(args=(1,), delay=3_600_000)
    keys = broker.keys("default")
    broker.client.zadd(keys.xq, {"dead-1": 1})
    broker.client.hset(keys.xq_msgs, "dead-1", alpha.message(2).encode())
    assert broker.known_queues() == ["default"]
    return broker


#: Every API call that names a queue, on the queue named.
API_CALLS: dict[str, Callable[[RedissonBroker, str], Any]] = {
    "stats": lambda b, q: b.stats(q),
    "history": lambda b, q: b.history(q),
    "running": lambda b, q: b.running(q),
    "waiting_groups": lambda b, q: b.waiting_groups(q),
    "pause": lambda b, q: b.pause(q),
    "resume": lambda b, q: b.resume(q),
    "delayed_queue.read_all": lambda b, q: b.delayed_queue(q).read_all(),
    "delayed_queue.get": lambda b, q: b.delayed_queue(q).get("m1"),
    "delayed_queue.remove": lambda b, q: b.delayed_queue(q).remove("m1"),
    "delayed_queue.remove_all": lambda b, q: b.delayed_queue(q).remove_all(),
    "delayed_queue.promote": lambda b, q: b.delayed_queue(q).promote("m1"),
    "delayed_queue.promote_all": lambda b, q: b.delayed_queue(q).promote_all(),
    "delayed_queue.reschedule": lambda b, q: b.delayed_queue(q).reschedule("m1", delay=1000),
    "dead_letters.read_all": lambda b, q: b.dead_letters(q).read_all(),
    "dead_letters.requeue": lambda b, q: b.dead_letters(q).requeue("dead-1"),
    "dead_letters.requeue_all": lambda b, q: b.dead_letters(q).requeue_all(),
    "dead_letters.clear": lambda b, q: b.dead_letters(q).clear(),
    "limits.get": lambda b, q: b.limits.get(q),
    "limits.set": lambda b, q: b.limits.set(q, concurrency=2),
    "limits.update": lambda b, q: b.limits.update(q, concurrency=2),
    "limits.clear": lambda b, q: b.limits.clear(q),
    "limits.weights": lambda b, q: b.limits.weights(q),
    "limits.set_weights": lambda b, q: b.limits.set_weights(q, {"gold": 3}),
}


@pytest.mark.parametrize("call", list(API_CALLS))
def test_every_api_call_refuses_an_unknown_queue_and_writes_nothing(
    known: RedissonBroker, redis_client: redis.Redis, call: str
) -> None:
    before = keyspace(redis_client)
    with pytest.raises(ValueError, match=rf"{REFUSED}: not a known queue in namespace 'dramatiq' \(known: default\)"):
        API_CALLS[call](known, NOPE)
    assert keyspace(redis_client) == before
    # The same call on the known queue goes through
    API_CALLS[call](known, "default")


def test_a_queue_only_the_registry_lists_is_known_and_one_it_no_longer_lists_is_not(
    known: RedissonBroker, make_broker: Callable[..., RedissonBroker], redis_url: str, redis_client: redis.Redis
) -> None:
    other = make_broker(url=redis_url)  # declares nothing: knows the registry's queues
    assert not other.queues and other.stats("default")["queues"]["default"]["scheduled"] == 1
    assert other.delayed_queue("default.DQ").size() == 1  # a suffixed name is its queue's
    with pytest.raises(ValueError, match="no queue is known yet"):
        make_broker(url=redis_url, namespace="elsewhere").dead_letters("default")
    redis_client.srem(registry_key("dramatiq"), "default")
    with pytest.raises(ValueError, match=r"unknown queue 'default'.*\(no queue is known yet\)"):
        other.stats("default")
    assert known.stats("default")["queues"]["default"]["scheduled"] == 1  # declared here: known
    with pytest.raises(ValueError, match="unknown queue 42"):
        known.limits.get(42)  # type: ignore[arg-type]


#: Every command that names a queue, with ``nope`` as its queue.
CLI_COMMANDS: list[tuple[str, ...]] = [
    ("stats", NOPE),
    ("watch", NOPE, "--count", "1"),
    ("list", NOPE),
    ("show", NOPE, "m1"),
    ("cancel", NOPE, "m1", "--yes"),
    ("cancel", NOPE, "--all"),
    ("promote", NOPE, "m1"),
    ("promote", NOPE, "--all", "--yes"),
    ("reschedule", NOPE, "m1", "--in", "1h"),
    ("dead", "list", NOPE),
    ("dead", "show", NOPE, "dead-1"),
    ("dead", "requeue", NOPE, "dead-1", "--yes"),
    ("dead", "requeue", NOPE, "--all"),
    ("dead", "purge", NOPE, "--all", "--yes"),
    ("pause", NOPE),
    ("resume", NOPE),
    ("running", NOPE),
    ("history", NOPE),
    ("limits", "get", NOPE),
    ("limits", "show", NOPE),
    ("limits", "set", NOPE, "--concurrency", "2"),
    ("limits", "update", NOPE, "--concurrency", "2"),
    ("limits", "clear", NOPE),
    ("limits", "weights", NOPE),
    ("limits", "weights", NOPE, "gold=3"),
]


def test_every_command_refuses_an_unknown_queue_with_the_known_ones_and_writes_nothing(
    known: RedissonBroker, redis_url: str, redis_client: redis.Redis
) -> None:
    cli = cli_runner(redis_url)
    before = keyspace(redis_client)
    # (--json changes nothing: the refusal comes before any output)
    for form in [*CLI_COMMANDS, ("stats", NOPE, "--json"), ("dead", "list", NOPE, "--json"), ("--json", "pause", NOPE)]:
        result: subprocess.CompletedProcess[str] = cli(*form)
        assert_one_line_error(result, 2, REFUSED, "(known: default)")
        assert result.stdout == "", form
    assert keyspace(redis_client) == before
