"""Small helpers shared by the tests."""

from __future__ import annotations

import gc
import json
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from typing import Any

import redis

from tests.harness.topology import wait_for

__all__ = [
    "READY",
    "RECORD_KEY",
    "STOP",
    "fill_to_maxmemory",
    "record",
    "records",
    "serve_until_stopped",
    "server_ms",
    "stop_worker_processes",
    "wait_for",
]

#: How a test and its worker processes (``python -m tests.proc_worker`` and the like) talk:
#: each process adds one to READY once its Worker runs, and stops once STOP exists.
READY, STOP = "test:workers-ready", "test:stop"

RECORD_KEY = "test:record"


def server_ms(client: redis.Redis) -> int:
    """The server's clock in epoch ms."""
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def record(client: redis.Redis, **fields: Any) -> None:
    """Append a run record, stamped with the server's clock and this process's pid."""
    import os

    fields.setdefault("at_ms", server_ms(client))
    fields.setdefault("pid", os.getpid())
    client.rpush(RECORD_KEY, json.dumps(fields))


def records(client: redis.Redis) -> list[dict[str, Any]]:
    return [json.loads(r) for r in client.lrange(RECORD_KEY, 0, -1)]


def fill_to_maxmemory(client: redis.Redis) -> None:
    """Set ``noeviction`` and ``maxmemory`` just above what is used, then add ballast
    (``ballast:<n>``) until writes are refused, in smaller and smaller pieces (a refused
    write's own query buffer counts: after it, a few KB may be free again), once the memory
    of earlier flushes is back.

    Clients of earlier tests left to the garbage collector close their connections when it
    runs, and each closed connection gives the server back its buffers (tens of KB):
    collect first, then fill twice, a moment apart, so memory freed by a late close is
    taken up again (a CI run saw a 100-message chunk fit after a single fill)."""
    gc.collect()
    client.config_set("maxmemory-policy", "noeviction")
    assert wait_for(lambda: int(client.info("memory").get("lazyfree_pending_objects", 0)) == 0)
    client.config_set("maxmemory", int(client.info("memory")["used_memory"]) + 256 * 1024)
    n = 0
    for round_ in range(2):
        if round_:
            time.sleep(0.3)
        for size in (4096, 512, 64, 8):
            while n < 4096:
                try:
                    client.set(f"ballast:{n}", b"x" * size)
                    n += 1
                except redis.exceptions.OutOfMemoryError:
                    break
            else:
                raise AssertionError("the server never became full")


def serve_until_stopped(broker: Any, client: redis.Redis) -> None:
    """The main loop of a test's worker process: run a Worker of ``broker`` (``$THREADS``
    threads, default 4), say it is ready, and stop it when the test says so."""
    from dramatiq import Worker

    worker = Worker(broker, worker_threads=int(os.environ.get("THREADS", "4")), worker_timeout=100)
    worker.start()
    client.incr(READY)
    try:
        while not client.exists(STOP):
            time.sleep(0.05)
    finally:
        worker.stop()


def stop_worker_processes(client: redis.Redis, procs: Sequence[subprocess.Popen[Any]]) -> None:
    """Tell the worker processes of :func:`serve_until_stopped` to stop, and wait for them
    (killed after 30 s)."""
    client.set(STOP, 1)
    for proc in procs:
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    client.delete(STOP, READY)


def sigint_as_in_a_terminal() -> None:
    """A ``preexec_fn`` for a child that a test stops with SIGINT, as Ctrl-C would: a suite
    started in the background by a non-interactive shell (a CI runner, ``cmd &``) passes
    SIGINT on ignored, and a Python started so installs no KeyboardInterrupt handler (it
    then ignores the test's SIGINT until the test's timeout kills it)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
