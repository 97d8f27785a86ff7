"""The metrics server and the dashboard when the Redis server they read is away: said
once at start (naming it), once per outage while they serve (no traceback per request),
once when it is back; scrapes still answer, pages say which server they cannot reach."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from dramatiq_redisson import RedissonBroker
from dramatiq_redisson import metrics as m
from dramatiq_redisson.dashboard import make_app
from dramatiq_redisson.embedded import free_loopback_port, server_binary, stop_process
from tests.helpers import sigint_as_in_a_terminal, wait_for
from tests.test_metrics import call_wsgi, value
from tests.wsgi_client import Client

ROOT = Path(__file__).resolve().parent.parent.parent


class LocalServer:
    """A server process on a port the test chose, started and stopped (by pid) on demand:
    the server an exporter reads, to take away and bring back."""

    def __init__(self, port: int, workdir: Path) -> None:
        self.port = port
        self.workdir = workdir
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        command = [str(server_binary()), "--port", str(self.port), "--bind", "127.0.0.1"]
        command += ["--save", "", "--appendonly", "no", "--dir", str(self.workdir)]
        self.proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = redis.Redis(port=self.port, socket_connect_timeout=0.5)
        try:

            def answers() -> bool:
                try:
                    return bool(client.ping())
                except redis.ConnectionError:
                    return False

            assert wait_for(answers, timeout=15), f"no server answered on port {self.port}"
        finally:
            client.close()

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc, timeout=10)
        self.proc = None


@pytest.fixture
def local_server(tmp_path: Path) -> Iterator[LocalServer]:
    server = LocalServer(free_loopback_port(), tmp_path)
    yield server
    server.stop()


def unreachable_broker(make_broker: Callable[..., Any], port: int) -> RedissonBroker:
    """A broker of the server on ``port`` whose calls fail at once while nothing listens."""
    client = redis.Redis(host="127.0.0.1", port=port, socket_connect_timeout=0.5, retry=Retry(NoBackoff(), 0))
    broker: RedissonBroker = make_broker(client=client)
    return broker


def lines_of(caplog: pytest.LogCaptureFixture, name: str) -> list[str]:
    """What ``name`` logged (its records, taken), each checked to carry no traceback."""
    records = [record for record in caplog.records if record.name == name]
    caplog.clear()
    assert all(record.exc_info is None for record in records), [r.getMessage() for r in records]
    return [record.getMessage() for record in records]


# -- in this process ---------------------------------------------------------------------


def test_metrics_say_an_outage_once_and_its_end_once(
    make_broker: Callable[..., Any], local_server: LocalServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="dramatiq_redisson.metrics")
    address = f"redis://127.0.0.1:{local_server.port}/0"
    app = m.make_wsgi_app(unreachable_broker(make_broker, local_server.port))

    # Scrapes while nothing listens answer with the up gauge at 0, and the log has one line.
    for _ in range(3):
        assert value(call_wsgi(app), "dramatiq_redisson_stats_up") == 0.0
    [away] = lines_of(caplog, "dramatiq_redisson.metrics")
    assert away.startswith(f"Cannot reach {address}: ") and "stats_up 0 until it answers" in away

    # The server comes up: said once.
    local_server.start()
    for _ in range(2):
        assert value(call_wsgi(app), "dramatiq_redisson_stats_up") == 1.0
    [back] = lines_of(caplog, "dramatiq_redisson.metrics")
    assert back.startswith(f"Reached {address} after ")

    # It goes away again: once more, as a lost connection.
    local_server.stop()
    for _ in range(3):
        assert value(call_wsgi(app), "dramatiq_redisson_stats_up") == 0.0
    [lost] = lines_of(caplog, "dramatiq_redisson.metrics")
    assert lost.startswith(f"Lost the connection to {address}: ")


def test_dashboard_pages_name_the_server_they_cannot_reach(
    make_broker: Callable[..., Any], local_server: LocalServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="dramatiq_redisson.Dashboard")
    address = f"redis://127.0.0.1:{local_server.port}/0"
    client = Client(make_app(unreachable_broker(make_broker, local_server.port)))

    for path in ("/", "/api/stats", "/queues/default", "/running", "/schedules", "/limits"):
        page = client.get(path)
        assert page.status == 503, (path, page.status)
        assert f"Cannot reach {address}: " in page.text and "Traceback" not in page.text, path
    [away] = lines_of(caplog, "dramatiq_redisson.Dashboard")
    assert away.startswith(f"Cannot reach {address}: ")

    local_server.start()
    assert client.get("/").status == 200
    assert client.get("/").status == 200
    [back] = lines_of(caplog, "dramatiq_redisson.Dashboard")
    assert back.startswith(f"Reached {address} after ")


# -- the commands --------------------------------------------------------------------------


def fetch(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def stderr_lines(path: Path) -> list[str]:
    return path.read_text().splitlines()


def run_server_command(tmp_path: Path, redis_port: int, *args: str) -> tuple[subprocess.Popen[bytes], Path]:
    """``dramatiq-redisson --url redis://127.0.0.1:<redis_port>/0 ARGS`` in its own session,
    its stderr to a file; stopped by SIGINT, as Ctrl-C stops it."""
    err = tmp_path / "stderr.txt"
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "DRAMATIQ_REDISSON_PLAIN")}
    command = [sys.executable, "-m", "dramatiq_redisson", "--url", f"redis://127.0.0.1:{redis_port}/0", *args]
    with err.open("wb") as stderr:
        proc = subprocess.Popen(
            command,
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            start_new_session=True,
            preexec_fn=sigint_as_in_a_terminal,
        )
    return proc, err


def stop(proc: subprocess.Popen[bytes]) -> int:
    """SIGINT ``proc`` (by pid) and wait; SIGKILL its process group if it does not exit."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
    try:
        return proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        return proc.wait()


def test_metrics_command_says_once_at_start_that_it_cannot_reach_the_server(tmp_path: Path) -> None:
    redis_port, port = free_loopback_port(), free_loopback_port()
    proc, err = run_server_command(tmp_path, redis_port, "metrics", "--port", str(port))
    try:
        # At start, before any scrape: it serves, and names the server it cannot reach.
        assert wait_for(lambda: len(stderr_lines(err)) >= 2, timeout=15), err.read_text()
        for _ in range(2):
            status, body = fetch(f"http://127.0.0.1:{port}/metrics")
            assert status == 200 and "dramatiq_redisson_stats_up 0.0" in body
        time.sleep(0.2)
    finally:
        code = stop(proc)
    lines = stderr_lines(err)
    assert code == 0, lines
    assert len(lines) == 2, lines
    assert lines[0].startswith(f"Serving Prometheus metrics of namespace 'dramatiq' on http://127.0.0.1:{port}/")
    assert f"Cannot reach redis://127.0.0.1:{redis_port}/0: " in lines[1], lines


def test_dashboard_command_says_once_at_start_that_it_cannot_reach_the_server(tmp_path: Path) -> None:
    redis_port, port = free_loopback_port(), free_loopback_port()
    proc, err = run_server_command(tmp_path, redis_port, "dashboard", "--port", str(port))
    address = f"redis://127.0.0.1:{redis_port}/0"
    try:
        assert wait_for(lambda: len(stderr_lines(err)) >= 2, timeout=15), err.read_text()
        for path in ("", "queues/default"):
            status, body = fetch(f"http://127.0.0.1:{port}/{path}")
            assert status == 503 and f"Cannot reach {address}: " in body, (status, body[-1000:])
        time.sleep(0.2)
    finally:
        code = stop(proc)
    lines = stderr_lines(err)
    assert code == 0, lines
    assert len(lines) == 2, lines
    assert lines[0].startswith(f"Serving the dashboard of namespace 'dramatiq' on http://127.0.0.1:{port}/")
    assert f"Cannot reach {address}: " in lines[1], lines
