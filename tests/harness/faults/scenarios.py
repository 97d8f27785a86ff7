"""The faults (one function each, in :data:`FAULTS`) and the scenarios built on them
(:data:`SCENARIOS`: server configuration, how the fault explains duplicates, and the
pass/fail criteria).

A fault function runs in its own thread from the moment the producer starts until
``ctx.stop`` is set (the last message's due time); it injects its fault repeatedly and
records each injection as an :class:`Event` on the record server's clock. It must leave
the server running and usable when it returns (SIGCONT, limits raised, server restarted).
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from .procs import ValkeyProcess, WorkerFleet, subprocess_env, token_pid

#: The queue the fault app's workers consume (``FAULTS_QUEUE`` set by the runner).
QUEUE = "faults"

#: The AOF ``appendfsync everysec`` policy may lose about the last second of writes on a
#: crash (the background fsync runs every second and may be up to another second late).
EVERYSEC_LOSS_MS = 2000


@dataclass(frozen=True)
class Size:
    """Workload size. ``scale`` stretches the fault schedule (``small`` compresses it)."""

    name: str
    messages: int
    rate: float
    commands: int
    processes: int
    threads: int
    scale: float
    grace_s: float


SIZES = {
    "full": Size("full", messages=3000, rate=200, commands=2, processes=2, threads=4, scale=1.0, grace_s=20),
    "small": Size("small", messages=300, rate=100, commands=1, processes=1, threads=2, scale=0.5, grace_s=10),
}


@dataclass(frozen=True)
class Event:
    """One injection. A run of a message is *disrupted* by it (and a later repeat of that
    message is an explained duplicate) when the run, from its start to its finish plus
    the ack slack, overlaps ``[start_ms - loss_ms, end_ms]``; with ``pid`` set only runs
    in that process count. ``loss_ms`` is how far back the fault may erase writes (AOF)."""

    kind: str
    start_ms: int
    end_ms: int
    pid: int | None = None
    loss_ms: int = 0
    #: ``end_ms`` is when the server accepted connections again (a restart, SIGCONT):
    #: the first run after it measures how soon delivery resumed.
    resumed: bool = False


@dataclass
class FaultContext:
    """What a fault function may touch."""

    server: ValkeyProcess
    fleet: WorkerFleet
    size: Size
    stop: threading.Event
    clock: Callable[[], int]  # the record server's clock, epoch ms
    events: list[Event] = field(default_factory=list)
    notes: dict[str, Any] = field(default_factory=dict)
    rng: random.Random = field(default_factory=lambda: random.Random(11))

    def admin(self) -> redis.Redis:
        """A fresh admin connection (default user) to the faulted server."""
        return redis.Redis(host="127.0.0.1", port=self.server.port, socket_timeout=30, socket_connect_timeout=5)

    def wait(self, seconds: float) -> bool:
        """Sleep ``seconds`` scaled by the size; False once the fault must stop."""
        return not self.stop.wait(seconds * self.size.scale)

    def event(self, kind: str, start_ms: int, end_ms: int | None = None, **kw: Any) -> None:
        self.events.append(Event(kind, start_ms, start_ms if end_ms is None else end_ms, **kw))

    def count(self, note: str, by: float = 1) -> None:
        self.notes[note] = self.notes.get(note, 0) + by


# -- the faults ---------------------------------------------------------------------


def no_fault(ctx: FaultContext) -> None:
    """Baseline (also used by ``acl-user``, whose 'fault' is the restricted user)."""


def _kill9(ctx: FaultContext, pid: int, kind: str) -> None:
    """SIGKILL one worker process and record it (nothing if it is already gone)."""
    at = ctx.clock()
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    ctx.event(kind, at, pid=pid)
    ctx.count("kills")


def worker_kill9(ctx: FaultContext) -> None:
    """SIGKILL one forked worker process every ~5 s (full size). The CLI parent then
    shuts its other children down and exits; the fleet restarts the command."""
    while ctx.wait(5.0):
        pids = ctx.fleet.worker_pids()
        if pids:
            _kill9(ctx, ctx.rng.choice(pids), "kill9")


def owner_kill9(ctx: FaultContext) -> None:
    """SIGKILL the worker process that holds the queue's transfer lease every ~5 s (full
    size): the one process that times every transfer of the queue. Another process must
    take the lease over when it lapses (``transfer_lease``, 2 s by default)."""
    from dramatiq_redisson._keys import QueueKeys

    lease = QueueKeys("dramatiq", QUEUE).lease
    admin = ctx.admin()
    try:
        while ctx.wait(5.0):
            holder = admin.get(lease)
            pid = token_pid(holder.decode().split(" ")[0]) if holder else None
            if pid is None or pid not in ctx.fleet.worker_pids():
                ctx.count("lease holder not found")
            else:
                _kill9(ctx, pid, "owner-kill9")
    finally:
        admin.close()


def _server_restart(ctx: FaultContext, signum: int, loss_ms: int) -> None:
    while ctx.wait(5.0):
        at = ctx.clock()
        ctx.server.signal(signum)
        ctx.server.wait_exit()
        time.sleep(1.0)
        ctx.server.start()
        ctx.event(signal.Signals(signum).name, at, ctx.clock(), loss_ms=loss_ms, resumed=True)
        ctx.count("restarts")


def server_sigterm(ctx: FaultContext) -> None:
    """Clean shutdown (AOF flushed) every ~5 s, restart on the same port after 1 s."""
    _server_restart(ctx, signal.SIGTERM, loss_ms=0)


def server_sigkill(ctx: FaultContext) -> None:
    """Crash the server process every ~5 s, restart on the same port after 1 s. Even with
    ``appendfsync everysec`` a process crash loses no acknowledged write (the server
    write()s the AOF before it replies; the kernel keeps what was not fsynced yet); the
    loss window stays as an allowance for explaining duplicates. What a host crash takes
    is ``server-crash-aof-tail``'s to measure."""
    fsync = ctx.server.config.get("appendfsync", "everysec")
    _server_restart(ctx, signal.SIGKILL, loss_ms=0 if fsync == "always" else EVERYSEC_LOSS_MS)


#: What a host crash (power loss, kernel panic) with ``appendfsync everysec`` takes: the
#: writes of the last second that reached the page cache but no fsync. A SIGKILL of the
#: server process loses none of them (the kernel still writes them out), so
#: ``server-crash-aof-tail`` cuts them off the AOF by hand before the restart.
AOF_TAIL_LOST_MS = 1000


def server_crash_aof_tail(ctx: FaultContext) -> None:
    """Crash every ~5 s as a host crash would with ``appendfsync everysec``: SIGKILL,
    then truncate the AOF's newest part back to its size of :data:`AOF_TAIL_LOST_MS`
    before the kill (sampled every 50 ms), then restart on the same port after 1 s.
    The server loads a truncated last command (``aof-load-truncated yes``, the default)."""
    sizes: list[tuple[float, Path, int]] = []
    sampling = threading.Event()

    def newest_part() -> Path | None:
        # Multi-part AOF (7.0 and later), or the single appendonly.aof of older servers.
        found = [*(ctx.server.workdir / "appendonlydir").glob("*.incr.aof"), *ctx.server.workdir.glob("appendonly.aof")]
        parts = sorted(found, key=lambda p: p.stat().st_mtime)
        return parts[-1] if parts else None

    def sample() -> None:
        while not sampling.wait(0.05):
            part = newest_part()
            if part is not None:
                try:
                    sizes.append((time.monotonic(), part, part.stat().st_size))
                except FileNotFoundError:
                    continue
                del sizes[: max(0, len(sizes) - 200)]

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        while ctx.wait(5.0):
            at = ctx.clock()
            killed_at = time.monotonic()
            ctx.server.signal(signal.SIGKILL)
            ctx.server.wait_exit()
            part = newest_part()
            earlier = [size for t, p, size in sizes if p == part and t <= killed_at - AOF_TAIL_LOST_MS / 1000]
            if part is not None and earlier:
                cut = part.stat().st_size - earlier[-1]
                with part.open("r+b") as f:
                    f.truncate(earlier[-1])
                ctx.count("AOF bytes cut", cut)
            time.sleep(1.0)
            ctx.server.start()
            ctx.event("host-crash", at, ctx.clock(), loss_ms=AOF_TAIL_LOST_MS + 1000, resumed=True)
            ctx.count("restarts")
    finally:
        sampling.set()
        sampler.join()


def _every_2s(ctx: FaultContext) -> float:
    """2 s on average at every size, jittered ±0.5 s so that the injections land at
    every phase of the consumers' own periodic work rather than in lockstep with it.
    Returned pre-divided by the size's scale, which :meth:`FaultContext.wait` applies."""
    return ctx.rng.uniform(1.5, 2.5) / ctx.size.scale


def _client_kill(ctx: FaultContext, client_type: str) -> None:
    admin = ctx.admin()
    try:
        while ctx.wait(_every_2s(ctx)):
            at = ctx.clock()
            killed = admin.execute_command("CLIENT", "KILL", "TYPE", client_type, "SKIPME", "yes")
            ctx.event(f"client-kill-{client_type}", at)
            ctx.count("injections")
            ctx.count("connections killed", int(killed))
    finally:
        admin.close()


def pubsub_kill(ctx: FaultContext) -> None:
    """``CLIENT KILL TYPE pubsub`` every 2 s: every consumer loses its subscription."""
    _client_kill(ctx, "pubsub")


def normal_kill(ctx: FaultContext) -> None:
    """``CLIENT KILL TYPE normal SKIPME yes`` every 2 s: every command connection
    (workers' and producer's) is cut, possibly with a reply in flight."""
    _client_kill(ctx, "normal")


def sigstop(ctx: FaultContext) -> None:
    """SIGSTOP the server for 5 s, then SIGCONT; twice at full size, once at small."""
    for _ in range(2 if ctx.size.scale >= 1 else 1):
        if not ctx.wait(3.0):
            return
        at = ctx.clock()
        ctx.server.signal(signal.SIGSTOP)
        try:
            time.sleep(5.0)
        finally:
            ctx.server.signal(signal.SIGCONT)
        ctx.event("sigstop", at, ctx.clock(), resumed=True)
        ctx.count("stops")


def server_stop_kill(ctx: FaultContext) -> None:
    """SIGSTOP the server for 4 s and kill -9 a worker process 1 s into the stop; once at
    small size, twice at full. The killed process's buffered calls (a fetch, a transfer,
    an ack) may run when the server resumes, putting messages into the ack set of a
    process that is already dead: they must run again without waiting for its heartbeat."""
    for _ in range(2 if ctx.size.scale >= 1 else 1):
        if not ctx.wait(3.0):
            return
        at = ctx.clock()
        ctx.server.signal(signal.SIGSTOP)
        try:
            time.sleep(1.0)
            pids = ctx.fleet.worker_pids()
            if pids:
                _kill9(ctx, ctx.rng.choice(pids), "kill9")
            time.sleep(3.0)
        finally:
            ctx.server.signal(signal.SIGCONT)
        ctx.event("sigstop", at, ctx.clock(), resumed=True)
        ctx.count("stops")


def debug_sleep(ctx: FaultContext) -> None:
    """``DEBUG SLEEP 5`` (the server blocks, sockets stay open); twice at full size,
    once at small."""
    admin = ctx.admin()
    try:
        for _ in range(2 if ctx.size.scale >= 1 else 1):
            if not ctx.wait(3.0):
                return
            at = ctx.clock()
            admin.execute_command("DEBUG", "SLEEP", "5")
            ctx.event("debug-sleep", at, ctx.clock())
            ctx.count("sleeps")
    finally:
        admin.close()


def script_flush(ctx: FaultContext) -> None:
    """``SCRIPT FLUSH`` every 2 s: every EVALSHA answers NOSCRIPT until reloaded."""
    admin = ctx.admin()
    try:
        while ctx.wait(_every_2s(ctx)):
            at = ctx.clock()
            admin.script_flush()
            ctx.event("script-flush", at)
            ctx.count("flushes")
    finally:
        admin.close()


#: Ballast written before the limit is set, and how far below the resulting memory use
#: the limit goes. While the ballast stays, memory use cannot drop below the limit even
#: if the workload's own data (well under the margin) is all deleted, so the server
#: refuses every write that may grow memory for the whole window: full, not flapping.
BALLAST_BYTES = 8 * 1024 * 1024
FULL_MARGIN_BYTES = 4 * 1024 * 1024


def maxmemory(ctx: FaultContext) -> None:
    """Fill the server: write an 8 MB ballast, then ``maxmemory`` = used - 4 MB with
    ``noeviction``; hold it ~15 s (full size), then lift the limit and drop the ballast.
    Records the full window as an event."""
    admin = ctx.admin()
    try:
        if not ctx.wait(3.0):
            return
        chunk = b"x" * (256 * 1024)
        for i in range(BALLAST_BYTES // len(chunk)):
            admin.set(f"ballast:{i}", chunk)
        admin.config_set("maxmemory-policy", "noeviction")
        used = int(admin.info("memory")["used_memory"])
        admin.config_set("maxmemory", str(used - FULL_MARGIN_BYTES))
        at = ctx.clock()
        full_since = time.monotonic()
        try:
            try:
                admin.set("ballast:probe", b"y")
                ctx.notes["maxmemory: a probe write was accepted"] = True
            except redis.exceptions.OutOfMemoryError:
                pass
            time.sleep(15.0 * ctx.size.scale)  # held full even past ctx.stop
        finally:
            admin.config_set("maxmemory", "0")
            for key in admin.scan_iter(match="ballast:*"):
                admin.delete(key)
        ctx.event("memory-full", at, ctx.clock())
        ctx.notes["memory-full s"] = round(time.monotonic() - full_since, 1)
    finally:
        admin.close()


FAULTS: dict[str, Callable[[FaultContext], None]] = {
    "none": no_fault,
    "worker-kill9": worker_kill9,
    "owner-kill9": owner_kill9,
    "server-sigterm": server_sigterm,
    "server-sigkill": server_sigkill,
    "server-sigkill-fsync-always": server_sigkill,
    "server-crash-aof-tail": server_crash_aof_tail,
    "pubsub-kill": pubsub_kill,
    "normal-kill": normal_kill,
    "sigstop": sigstop,
    "server-stop-kill": server_stop_kill,
    "debug-sleep": debug_sleep,
    "script-flush": script_flush,
    "maxmemory": maxmemory,
    "acl-user": no_fault,
}


# -- ACL (provisional) --------------------------------------------------------------

#: Used when the product under test has no ``acl_rule()`` (e.g. the BEFORE commit).
PROVISIONAL_ACL_RULE = (
    "resetkeys resetchannels ~dramatiq:* ~redisson_delay_queue* &redisson_delay_queue_channel:* +@all -@dangerous +info"
)


def acl_rule(product_root: Path, server_version: tuple[int, int] | None = None) -> tuple[str, str]:
    """The ACL rule (ACL SETUSER text after ``on >password``) for the broker's user and
    where it came from: ``$FAULTS_ACL_RULE``, else the product's own
    ``dramatiq_redisson.acl_rule()`` (or ``dramatiq_redisson.connection._permissions.acl_rule()``),
    rendered for ``server_version`` when the product's rule follows the server's version,
    asked in a subprocess that imports the product under test, else the provisional rule."""
    if os.environ.get("FAULTS_ACL_RULE"):
        return os.environ["FAULTS_ACL_RULE"], "FAULTS_ACL_RULE"
    version = f"({server_version[0]}, {server_version[1]}, 0)" if server_version else "None"
    probe = (
        "import inspect\n"
        "try:\n from dramatiq_redisson import acl_rule\n"
        "except ImportError:\n from dramatiq_redisson.connection._permissions import acl_rule\n"
        "versioned = 'server_version' in inspect.signature(acl_rule).parameters\n"
        f"print(acl_rule(server_version={version}) if versioned else acl_rule())\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe],
        env=subprocess_env(product_root, {}),
        cwd="/",
        capture_output=True,
        text=True,
        timeout=60,
    )
    if result.returncode == 0 and result.stdout.strip():
        return result.stdout.strip(), "product acl_rule()"
    return PROVISIONAL_ACL_RULE, "provisional"


# -- scenarios ------------------------------------------------------------------------


@dataclass(frozen=True)
class Criteria:
    """Pass/fail thresholds; ``None`` means reported, never failed."""

    max_lost: int | None = 0
    max_unexplained_dups: int | None = 0
    max_early: int | None = 0
    #: Most lateness (ms) of a scheduled message; messages later than ``stranded_ms``
    #: are not held to it (a killed process held them: they come back after the
    #: heartbeat timeout) and are counted apart.
    max_late_ms: int | None = None
    stranded_ms: int = 10_000
    #: Most time (ms) from a process kill until each message it was running runs again
    #: elsewhere (found dead by its closed connections, see dramatiq_redisson._liveness).
    max_recovery_ms: int | None = None
    #: At full size: most lateness (ms) of any message measured from when the fault
    #: cleared (the end of the last fault window it waited through, or the kill of the
    #: process that held it), see ``analysis.after_clear``.
    max_late_after_clear_ms: int | None = 3000
    #: At full size: most time (ms) from the server accepting connections again (after a
    #: restart or a SIGCONT) to the first run started.
    max_resume_ms: int | None = 500


@dataclass(frozen=True)
class Scenario:
    name: str
    fault: Callable[[FaultContext], None]
    doc: str
    server_config: dict[str, str] = field(default_factory=dict)
    criteria: Criteria = field(default_factory=Criteria)
    acl_user: bool = False
    #: Worker commands × processes per command, when the size's do not fit the fault
    #: (``None``: the size's).
    commands: int | None = None
    processes: int | None = None
    #: Seconds to keep watching after the fault stopped even when all messages ran, so a
    #: late duplicate shows up (kill -9: stranded messages return after the heartbeat
    #: timeout plus a maintenance interval; see fault_app).
    settle_s: float = 2.0
    #: Whether Dramatiq's built-in RedisBroker can run it side by side (``--broker
    #: builtin``): not when the fault reads our keys or applies our ACL rule.
    builtin: bool = True


KILL9_SETTLE_S = (15_000 + 5_000) / 1000 + 3

#: How soon (ms) what a killed process held must run again: found dead by its closed
#: connections (2 s) after the lease lapses (2 s) when it held the lease, plus the restart
#: of the killed command when (small size) it was the only one; the suite's heartbeat
#: path alone would take 15 s + a maintenance interval.
KILL9_MAX_RECOVERY_MS = 10_000

#: The default transfer lease (2 s) plus 1 s: how late a scheduled message may run when
#: the lease holder is killed.
OWNER_KILL_MAX_LATE_MS = 2000 + 1000

SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in [
        Scenario("none", no_fault, "baseline, no fault"),
        Scenario(
            "worker-kill9",
            worker_kill9,
            "SIGKILL a forked worker process every 5 s; the command is restarted; what it held runs again "
            "within 10 s (liveness; the heartbeat alone took 15 s + a maintenance interval)",
            settle_s=KILL9_SETTLE_S,
            criteria=Criteria(max_recovery_ms=KILL9_MAX_RECOVERY_MS),
        ),
        Scenario(
            "owner-kill9",
            owner_kill9,
            "SIGKILL the worker process holding the transfer lease every 5 s; 2 single-process commands, "
            "so a standby survives; scheduled lateness <= lease (2 s) + 1 s",
            settle_s=KILL9_SETTLE_S,
            commands=2,
            processes=1,
            criteria=Criteria(max_late_ms=OWNER_KILL_MAX_LATE_MS, max_recovery_ms=KILL9_MAX_RECOVERY_MS),
            builtin=False,
        ),
        Scenario("server-sigterm", server_sigterm, "clean server shutdown every 5 s, restart after 1 s"),
        Scenario(
            "server-sigkill",
            server_sigkill,
            "server process crash every 5 s, restart after 1 s, appendfsync everysec (loss is reported, not failed)",
            criteria=Criteria(max_lost=None),
        ),
        Scenario(
            "server-sigkill-fsync-always",
            server_sigkill,
            "server crash every 5 s, restart after 1 s, appendfsync always",
            server_config={"appendfsync": "always"},
        ),
        Scenario(
            "server-crash-aof-tail",
            server_crash_aof_tail,
            "host crash every 5 s with appendfsync everysec: SIGKILL, the last 1 s of AOF cut off, "
            "restart after 1 s; loss is reported, not failed",
            criteria=Criteria(max_lost=None, max_late_after_clear_ms=None),
        ),
        Scenario("pubsub-kill", pubsub_kill, "CLIENT KILL TYPE pubsub every 2 s"),
        Scenario("normal-kill", normal_kill, "CLIENT KILL TYPE normal SKIPME yes every 2 s"),
        Scenario("sigstop", sigstop, "SIGSTOP the server 5 s, then SIGCONT"),
        Scenario(
            "server-stop-kill",
            server_stop_kill,
            "SIGSTOP the server 4 s, kill -9 a worker process 1 s into the stop; 2 single-process commands, "
            "so one survives; what the killed process held (or its buffered calls put in its ack set on "
            "resume) runs again within 10 s",
            settle_s=KILL9_SETTLE_S,
            commands=2,
            processes=1,
            criteria=Criteria(max_recovery_ms=KILL9_MAX_RECOVERY_MS),
        ),
        Scenario("debug-sleep", debug_sleep, "DEBUG SLEEP 5"),
        Scenario("script-flush", script_flush, "SCRIPT FLUSH every 2 s"),
        Scenario("maxmemory", maxmemory, "server full (ballast, maxmemory below use, noeviction) ~15 s"),
        Scenario(
            "acl-user",
            no_fault,
            "no fault; workers and producer run as a restricted ACL user",
            acl_user=True,
            builtin=False,
        ),
    ]
}

#: The faulted server's configuration before a scenario's ``server_config``.
BASE_SERVER_CONFIG = {
    "appendonly": "yes",
    "appendfsync": "everysec",
    "enable-debug-command": "yes",
}
