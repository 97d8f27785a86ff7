"""The example app: the demo end to end, its order store, and its broker module."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import redis

from dramatiq_redisson.embedded import free_loopback_port
from example_app.orders import CANCELLED, PAID, OrderStore
from example_app.scenario import PLAN, expected_counts

ROOT = Path(__file__).resolve().parent.parent


def run_python(*args: str, redis_url: str | None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run ``python *args`` from the repository root with ``REDIS_URL`` set (or unset)."""
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    if redis_url is not None:
        env["REDIS_URL"] = redis_url
    return subprocess.run(
        [sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


def test_demo_settles_every_order_as_planned(redis_url: str) -> None:
    result = run_python("-m", "example_app", redis_url=redis_url)
    output = f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    assert result.returncode == 0, output
    assert "Traceback" not in result.stderr, output

    summary = [line for line in result.stdout.splitlines() if line.startswith("SUMMARY ")]
    assert len(summary) == 1, output
    counts = {key: value for key, value in re.findall(r"(\w+)=(\S+)", summary[0])}
    paid, cancelled = expected_counts()
    assert counts["orders"] == str(len(PLAN))
    assert counts["paid"] == str(paid)
    assert counts["cancelled"] == str(cancelled)
    # Every paid order's timer was removed; every unpaid order's timer fired, and no other.
    assert counts["timers_removed"] == str(paid)
    assert counts["timers_fired"] == str(cancelled)
    assert counts["errors"] == "0"
    assert summary[0].endswith("-> OK")

    assert result.stdout.count("timer cancelled: yes") == paid, output
    assert result.stdout.count("timer fired -> order cancelled") == cancelled, output
    assert f"delayed_queue('order_timeouts').size() = {len(PLAN)}" in result.stdout, output


def test_order_store_lets_only_the_first_of_payment_and_timer_win(redis_client: redis.Redis) -> None:
    store = OrderStore(redis_client, "race")
    store.create(1)
    store.create(2)

    # Paid first: the timer that fires afterwards leaves the order alone.
    assert store.pay(1)
    assert not store.cancel_if_unpaid(1)
    assert store.status(1) == PAID

    # Timed out first: a late payment is refused.
    assert store.cancel_if_unpaid(2)
    assert not store.pay(2)
    assert store.status(2) == CANCELLED

    events = store.pop_events()
    assert [(e.kind, e.order, e.ok, e.seen) for e in events] == [
        ("paid", 1, True, "pending"),
        ("timer_fired", 1, False, "paid"),
        ("timer_fired", 2, True, "pending"),
        ("paid", 2, False, "cancelled"),
    ]
    assert [e.t for e in events] == sorted(e.t for e in events)
    assert store.pop_events() == []
    store.delete([1, 2])
    assert not redis_client.keys("example_app:race:*")


PROBE = """
import dramatiq
import example_app.tasks as tasks
assert dramatiq.get_broker() is tasks.broker
assert tasks.cancel_if_unpaid.broker is tasks.broker
assert tasks.QUEUE_NAME in tasks.broker.get_declared_queues()
kwargs = tasks.broker.client.connection_pool.connection_kwargs
print(kwargs["host"], kwargs["port"], kwargs.get("db") or 0)
"""


def test_tasks_module_is_a_broker_module_for_the_dramatiq_cli(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    url = client.connection_pool.connection_kwargs
    client.close()
    result = run_python("-c", PROBE, redis_url=redis_url)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [str(url["host"]), str(url["port"]), str(url.get("db") or 0)]

    default = run_python("-c", PROBE, redis_url=None)
    assert default.returncode == 0, default.stderr
    assert default.stdout.split() == ["127.0.0.1", "6379", "0"]


def test_demo_against_a_closed_redis_url_says_so_in_one_line() -> None:
    port = free_loopback_port()
    for url, shown in (
        (f"redis://127.0.0.1:{port}/0", f"redis://127.0.0.1:{port}/0"),
        (f"redis://shop:s3cret@127.0.0.1:{port}/0", f"redis://shop:***@127.0.0.1:{port}/0"),
    ):
        result = run_python("-m", "example_app", redis_url=url)
        assert result.returncode == 2, result.stderr
        assert result.stdout == ""
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1, result.stderr
        assert lines[0].startswith(f"python -m example_app: error: cannot reach REDIS_URL={shown}: "), lines[0]
        assert "`dramatiq-redisson server`" in lines[0] and "unset REDIS_URL" in lines[0]
        assert "s3cret" not in lines[0]
