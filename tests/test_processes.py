"""Many worker processes, and clocks that disagree with the server."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import dramatiq
import pytest
import redis
from freezegun import freeze_time

from dramatiq_redisson import RedissonBroker
from tests.helpers import READY, records, server_ms, stop_worker_processes, wait_for

ROOT = Path(__file__).resolve().parent.parent
ZSET = "redisson_delay_queue_timeout:{dramatiq:default}"


@contextmanager
def worker_processes(
    redis_url: str,
    client: redis.Redis,
    count: int,
    shift_s: float = 0.0,
    cluster_url: str = "",
    env: dict[str, str] | None = None,
    logs: Path | None = None,
) -> Iterator[None]:
    """``count`` processes of ``tests/proc_worker.py`` (their broker on ``cluster_url``
    when given, records on ``redis_url``; ``env``: more of their environment), stopped at
    exit. ``logs``: a directory for each process's output (``worker-<n>.log``), quoted
    when one does not exit cleanly."""
    env = {
        **os.environ,
        "REDIS_URL": redis_url,
        "CLOCK_SHIFT_S": str(shift_s),
        "PYTHONPATH": str(ROOT),
        **(env or {}),
    }
    if cluster_url:
        env["CLUSTER_URL"] = cluster_url
    client.delete("test:stop", "test:workers-ready")
    procs = []
    for n in range(count):
        with ExitStack() as stack:
            streams: dict[str, Any] = {}
            if logs is not None:
                out = stack.enter_context(open(logs / f"worker-{n}.log", "wb"))
                streams = {"stdin": subprocess.DEVNULL, "stdout": out, "stderr": subprocess.STDOUT}
            procs.append(subprocess.Popen([sys.executable, "-m", "tests.proc_worker"], env=env, cwd=ROOT, **streams))
    try:
        assert wait_for(lambda: int(client.get(READY) or 0) == count, timeout=30)
        yield
    finally:
        stop_worker_processes(client, procs)
    assert [p.returncode for p in procs] == [0] * count, worker_logs(logs) if logs is not None else ""


def worker_logs(logs: Path) -> str:
    """The tail of every worker's output in ``logs`` (see :func:`worker_processes`)."""
    return "\n".join(f"--- {p.name}:\n{p.read_text(errors='replace')[-4000:]}" for p in sorted(logs.glob("*.log")))


@pytest.mark.slow
def test_many_worker_processes_run_every_mixed_delay_message_exactly_once(
    broker: RedissonBroker,
    redis_url: str,
    redis_client: redis.Redis,
    stamp: dramatiq.Actor,  # type: ignore[type-arg]
) -> None:
    rng = random.Random(7)
    count = 3_000
    delays = [rng.choice([0, rng.randint(500, 3_000)]) for _ in range(count)]
    with worker_processes(redis_url, redis_client, count=3):
        dues: dict[int, int] = {}
        for start in range(0, count, 250):
            chunk = list(range(start, min(count, start + 250)))
            by_delay: dict[int, list[int]] = {}
            for i in chunk:
                by_delay.setdefault(delays[i], []).append(i)
            for delay, items in by_delay.items():
                messages = broker.enqueue_many([stamp.message(i) for i in items], delay=delay)
                if delay:
                    scores = redis_client.zmscore(ZSET, [m.options["redis_message_id"] for m in messages])
                    dues.update({i: int(s) for i, s in zip(items, scores, strict=True) if s is not None})
        assert wait_for(lambda: redis_client.llen("test:record") >= count, timeout=60)
        time.sleep(0.5)  # give a duplicate the chance to show up
    runs = records(redis_client)
    seen = Counter(r["i"] for r in runs)
    assert set(seen) == set(range(count)), "lost messages"
    assert max(seen.values()) == 1, "duplicated messages"
    assert len({r["pid"] for r in runs}) == 3
    early = [r for r in runs if r["i"] in dues and r["at_ms"] < dues[r["i"]]]
    assert early == []
    assert len(dues) > count // 3  # most delayed ones were snapshotted before moving


@pytest.mark.parametrize("shift_s", [3600.0, -3600.0])
def test_worker_clock_skew_does_not_move_delivery(
    broker: RedissonBroker,
    redis_url: str,
    redis_client: redis.Redis,
    stamp: dramatiq.Actor,
    shift_s: float,  # type: ignore[type-arg]
) -> None:
    # Given a worker process whose clock is an hour off
    with worker_processes(redis_url, redis_client, count=1, shift_s=shift_s):
        # When a message is sent with a 1 s delay
        message = stamp.send_with_options(args=(1,), delay=1_000)
        due = int(redis_client.zscore(ZSET, message.options["redis_message_id"]))
        # Then it runs at its due time on the server clock: not early, not an hour late
        assert wait_for(lambda: len(records(redis_client)) == 1, timeout=5)
    [run] = records(redis_client)
    assert due <= run["at_ms"] <= due + 200


@pytest.mark.parametrize("shift", [timedelta(hours=1), timedelta(hours=-1)])
def test_producer_clock_skew_does_not_move_delivery(
    broker: RedissonBroker,
    redis_url: str,
    redis_client: redis.Redis,
    stamp: dramatiq.Actor,
    shift: timedelta,  # type: ignore[type-arg]
) -> None:
    with worker_processes(redis_url, redis_client, count=1):
        # Given a producer whose clock is an hour off
        before = server_ms(redis_client)
        with freeze_time(datetime.now(timezone.utc) + shift, tick=True):
            message = stamp.send_with_options(args=(1,), delay=1_000)
        due = int(redis_client.zscore(ZSET, message.options["redis_message_id"]))
        # Then the due time is the server's now + delay
        assert before + 1_000 <= due <= server_ms(redis_client) + 1_000
        assert wait_for(lambda: len(records(redis_client)) == 1, timeout=5)
    [run] = records(redis_client)
    assert due <= run["at_ms"] <= due + 200
