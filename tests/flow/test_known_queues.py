"""A queue a process declares (an actor on it) is known on the server at once, though
nothing was sent to it and no worker consumed it (issue 56): the command line, run as a
subprocess with only ``--url``, then lists it in ``stats`` and shows the limits the app
set on it through ``broker.limits``; a name nobody declared is still refused. A broker
built while the server is down declares its queues without failing and lists them once
the server answers."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import cast

import dramatiq
import pytest
import redis

from dramatiq_redisson import RedissonBroker
from dramatiq_redisson._keys import registry_key
from dramatiq_redisson.admin import _queue_admin
from tests.cli.test_cli import assert_one_line_error, cli_runner, ok_json
from tests.harness.faults.procs import ValkeyProcess, free_loopback_port

Run = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture
def cli(redis_url: str) -> Run:
    """``python -m dramatiq_redisson --url <the test server> ARGS``: a process that declares
    nothing, so it knows only the queues the server lists."""

    run = cli_runner(redis_url)

    def with_url(*args: str) -> subprocess.CompletedProcess[str]:
        result: subprocess.CompletedProcess[str] = run("--url", redis_url, *args, url=False)
        return result

    return with_url


def ok_text(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    return result.stdout


def listed(client: redis.Redis, namespace: str = "dramatiq") -> set[str]:
    return {name.decode() for name in cast("set[bytes]", client.smembers(registry_key(namespace)))}


def test_a_declared_queue_limited_through_the_api_is_visible_to_the_command_line(
    cli: Run, broker: RedissonBroker, redis_client: redis.Redis
) -> None:
    @dramatiq.actor(queue_name="reports", max_retries=0)
    def report() -> None:
        pass

    broker.limits.set("reports", concurrency=3, group_concurrency=1)

    shown = ok_text(cli("limits", "get", "reports"))
    assert shown.startswith("'reports': concurrency 3, per group 1; 0 running"), shown
    every = ok_json(cli("limits", "show", "--json"))
    assert [(q["queue"], q["concurrency"], q["group_concurrency"]) for q in every["queues"]] == [("reports", 3, 1)]
    # The other verbs take it too, and the API's broker sees what they wrote
    assert ok_text(cli("limits", "set", "reports", "--concurrency", "5")).startswith("set 'reports': concurrency 5")
    assert broker.limits.get("reports")["concurrency"] == 5
    assert ok_text(cli("limits", "clear", "reports")).startswith("cleared 'reports': concurrency none")
    # A name nobody declared, sent to or consumed is still refused, and nothing is written
    before = sorted(redis_client.keys("*"))
    for args in (("limits", "get", "report"), ("limits", "set", "report", "--concurrency", "2"), ("stats", "report")):
        assert_one_line_error(cli(*args), 2, "unknown queue 'report'", "known: reports")
    assert sorted(redis_client.keys("*")) == before


def test_declaring_alone_makes_stats_list_the_queue_with_zero_counts(
    cli: Run, broker: RedissonBroker, redis_client: redis.Redis
) -> None:
    assert "No known queues" in ok_text(cli("stats"))

    @dramatiq.actor(queue_name="invoices", max_retries=0)
    def invoice() -> None:
        pass

    document = ok_json(cli("stats", "--json"))
    assert list(document["queues"]) == ["invoices"]
    counts = document["queues"]["invoices"]
    for field in ("ready", "in_flight", "scheduled", "overdue", "dead", "consumers", "legacy_delayed"):
        assert counts[field] == 0, field
    assert ok_json(cli("stats", "invoices", "--json"))["queues"]["invoices"]["ready"] == 0
    # One command per queue per process: declaring it again (another actor) writes nothing
    redis_client.srem(registry_key("dramatiq"), "invoices")

    @dramatiq.actor(queue_name="invoices", max_retries=0)
    def invoice_again() -> None:
        pass

    assert listed(redis_client) == set()


def test_a_limit_set_on_a_declared_queue_the_registry_dropped_lists_it_again(
    cli: Run, broker: RedissonBroker, redis_client: redis.Redis
) -> None:
    @dramatiq.actor(queue_name="exports", max_retries=0)
    def export() -> None:
        pass

    broker.flush("exports")  # the queue leaves the registry; this process still declares it
    assert "exports" not in listed(redis_client)
    broker.limits.set("exports", concurrency=2)
    assert ok_text(cli("limits", "get", "exports")).startswith("'exports': concurrency 2,")
    for change in (
        lambda: broker.limits.update("exports", concurrency=4),
        lambda: broker.limits.set_weights("exports", {"gold": 2}),
        lambda: broker.limits.clear("exports"),
    ):
        broker.flush("exports")
        change()
        assert "exports" in listed(redis_client)
    # Reads write nothing
    broker.flush("exports")
    broker.limits.get("exports")
    broker.limits.weights("exports")
    assert "exports" not in listed(redis_client)


def test_a_sharded_queue_s_limits_are_seen_whole_by_a_process_without_its_shards(
    cli: Run, make_broker: Callable[..., RedissonBroker], redis_url: str, redis_client: redis.Redis
) -> None:
    sharded = make_broker(url=redis_url, shards={"big": 3})
    declare(sharded, "big")
    assert listed(redis_client) == {"big"}  # shard 0 is the queue itself
    sharded.limits.set("big", concurrency=6)
    # Each shard holds a share; the command line (no shards setting) reads the layout of
    # the shards the registry lists, and shows the limit asked for the whole queue
    assert len(sharded.shards_of("big")) == 3 and listed(redis_client) == set(sharded.shards_of("big"))
    assert ok_text(cli("limits", "get", "big")).startswith("'big': concurrency 6,")
    assert list(ok_json(cli("stats", "--json"))["queues"]) == ["big"]


@pytest.fixture
def later_server(tmp_path: Path) -> Iterator[ValkeyProcess]:
    """A server on a loopback port that nothing listens on until the test starts it."""
    server = ValkeyProcess("later", tmp_path / "later", {}, port=free_loopback_port())
    yield server
    server.stop()


def declare(broker: RedissonBroker, queue_name: str) -> None:
    """Declare a do-nothing actor on ``queue_name``, as an app's import does."""

    def work() -> None:
        pass

    dramatiq.actor(actor_name=f"work_{queue_name}", queue_name=queue_name, max_retries=0, broker=broker)(work)


def test_a_broker_built_while_the_server_is_down_declares_and_lists_its_queues_once_it_answers(
    later_server: ValkeyProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    quiet = 3.0
    monkeypatch.setattr(_queue_admin, "RELIST_AFTER_S", quiet)
    down = RedissonBroker(url=later_server.url)
    try:
        before = time.monotonic()
        declare(down, "early")  # tries once, and fails: nothing listens
        failed = time.monotonic()
        declare(down, "early_too")  # within the quiet spell: not tried
        assert down.get_declared_queues() == {"early", "early_too"}
        later_server.start()
        client = redis.Redis.from_url(later_server.url)
        try:
            assert listed(client) == set()
            # A limit set on one lists it (the limit needs the server anyway)
            down.limits.set("early", concurrency=2)
            assert listed(client) == {"early"}
            # Within the quiet spell after the failed try, a declaration does not try again
            declare(down, "quiet")
            if time.monotonic() < before + quiet:
                assert listed(client) == {"early"}
            # After it, the next declaration lists every queue declared meanwhile
            time.sleep(max(0.0, failed + quiet - time.monotonic()) + 0.05)
            declare(down, "late")
            assert listed(client) == {"early", "early_too", "quiet", "late"}
        finally:
            client.close()
    finally:
        down.close()
