"""Measuring: the server's slow log and command counts by script, and the run records
(lateness, lost, duplicated and early messages, percentiles) the scenarios analyse."""

from __future__ import annotations

import hashlib
import itertools
import math
import statistics
import time
from collections.abc import Iterable, Sequence
from typing import Any

import redis

#: The list the benchmark actors record their runs on.
REC_KEY = "bench:rec"


#: The list the benchmark actors record their runs on.
def script_sha(source: bytes | str) -> str:
    if isinstance(source, str):
        source = source.encode()
    return hashlib.sha1(source).hexdigest()


def classify_slowlog(entries: Iterable[tuple[int, list[bytes]]], names: dict[str, str]) -> dict[str, dict[str, float]]:
    """Group slowlog entries by script name (EVALSHA by sha; dramatiq's dispatch.lua by its
    sub-command) or command name: count, total µs, max µs. Commands run inside scripts
    appear as entries of their own (e.g. HSET, LREM)."""
    groups: dict[str, dict[str, float]] = {}
    for duration, argv in entries:
        if not argv:
            continue
        cmd = argv[0].decode(errors="replace").upper()
        if cmd in (
            "SLOWLOG",
            "CONFIG",
            "INFO",
            "TIME",
            "LLEN",
            "LRANGE",
            "HMGET",
            "ZSCORE",
            "FLUSHDB",
            "SCRIPT",
            "PING",
            "CLIENT",
            "HELLO",
            "MEMORY",
        ):
            name = "(harness) " + cmd
        elif cmd == "EVAL":
            name = "recorder"
        elif cmd == "FCALL" and len(argv) > 2:
            # A function of the product's library (scripts._library): named after its script.
            function = argv[1].decode()
            name = names.get(function, "function " + function)
        elif cmd == "EVALSHA" and len(argv) > 2:
            sha = argv[1].decode()
            name = names.get(sha, "script " + sha[:8])
            if name == "dispatch":
                numkeys = int(argv[2])
                idx = 3 + numkeys
                name = "dispatch:" + (argv[idx].decode() if len(argv) > idx else "?")
        else:
            name = cmd
        g = groups.setdefault(name, {"count": 0, "total_us": 0, "max_us": 0, "over_1ms": 0, "over_5ms": 0})
        g["count"] += 1
        g["total_us"] += duration
        g["max_us"] = max(g["max_us"], duration)
        g["over_1ms"] += duration > 1000
        g["over_5ms"] += duration > 5000
    return groups


def longest_call(groups: dict[str, dict[str, float]]) -> dict[str, Any]:
    """The longest logged call the broker made (harness and recorder excluded), and the
    number of script calls over 1 ms / 5 ms per script."""
    mx, who = 0.0, None
    for name, g in groups.items():
        if name.startswith("(harness)") or name == "recorder":
            continue
        if g["max_us"] > mx:
            mx, who = g["max_us"], name
    return {"max_us": mx, "by": who}


#: What a script call does, as far as the fleet scenario is concerned. "fetch": take
#: ready messages (RedissonBroker's fetch.lua; the built-in dispatch.lua ``fetch`` on the
#: queue); "transfer": look for due messages and move them (transfer.lua; the built-in
#: ``fetch`` on the delay queue ``.DQ``, which its worker then re-enqueues and acks).
SCRIPT_CATEGORIES = ("fetch", "transfer", "ack", "other")


def script_category(script: str, argv: Sequence[Any]) -> str:
    """The category of one EVALSHA call of the script named ``script``."""

    def text(v: Any) -> str:
        return v.decode(errors="replace") if isinstance(v, bytes) else str(v)

    if script == "dispatch":  # dramatiq's dispatch.lua: KEYS, then command, timestamp, queue, …
        numkeys = int(argv[2])
        command = text(argv[3 + numkeys]) if len(argv) > 3 + numkeys else ""
        queue = text(argv[5 + numkeys]) if len(argv) > 5 + numkeys else ""
        if command == "fetch":
            return "transfer" if queue.endswith(".DQ") else "fetch"
        return "ack" if command == "ack" else "other"
    if "transfer" in script:
        return "transfer"
    if "fetch" in script:
        return "fetch"
    return "ack" if script == "ack" else "other"


def counter_slots(command_names: Iterable[str]) -> list[str]:
    """The slots of a :class:`CommandCounter`: one per command name, one per script
    category (``script:fetch`` …), and ``?`` for anything else."""
    return [*sorted(set(command_names)), *(f"script:{c}" for c in SCRIPT_CATEGORIES), "?"]


class CommandCounter:
    """Counts the commands this process sends, by name, and its EVALSHA (and FCALL) calls by
    :data:`SCRIPT_CATEGORIES`, into ``out[base + slot]`` (a list, or a shared array the
    harness reads). Hooked into redis-py's command packer, which every command, pipelined
    or not, goes through; counts only while :meth:`active` (one counter at a time)."""

    _current: CommandCounter | None = None
    _hooked = False

    def __init__(self, slots: Sequence[str], scripts: dict[str, str], out: Any, base: int = 0) -> None:
        import threading

        self.index = {name: i for i, name in enumerate(slots)}
        self.scripts, self.out, self.base = scripts, out, base
        self.unknown = self.index["?"]
        self.lock = threading.Lock()

    def count(self, argv: Sequence[Any]) -> None:
        first = argv[0]
        name = (first.decode() if isinstance(first, bytes) else str(first)).split(" ", 1)[0].lower()
        slots = [self.index.get(name, self.unknown)]
        if name in ("evalsha", "fcall") and len(argv) > 2:
            # (FCALL names a function of the library: script_names maps it to its script)
            sha = argv[1].decode() if isinstance(argv[1], bytes) else str(argv[1])
            category = script_category(self.scripts.get(sha, "?"), argv)
            slots.append(self.index[f"script:{category}"])
        with self.lock:
            for slot in slots:
                self.out[self.base + slot] += 1

    def activate(self) -> None:
        CommandCounter._hook()
        CommandCounter._current = self

    @staticmethod
    def deactivate() -> None:
        CommandCounter._current = None

    @staticmethod
    def _hook() -> None:
        if CommandCounter._hooked:
            return
        import redis.connection as rc

        for cls_name in ("PythonRespSerializer", "HiredisRespSerializer"):
            cls = getattr(rc, cls_name, None)
            if cls is None:
                continue

            def pack(self: Any, *args: Any, _original: Any = cls.pack) -> Any:
                counter = CommandCounter._current
                if counter is not None and args:
                    try:
                        counter.count(args)
                    except Exception:  # counting must never break a command
                        pass
                return _original(self, *args)

            cls.pack = pack
        CommandCounter._hooked = True


def read_records(r: redis.Redis, key: str = REC_KEY) -> list[tuple[int, float, int]]:
    """(seq, start ms on the server clock, pid) of every actor run recorded so far."""
    out = []
    for raw in r.lrange(key, 0, -1):
        seq, sec, usec, pid = raw.split()
        out.append((int(seq), int(sec) * 1000 + int(usec) / 1000, int(pid)))
    return out


def wait_records(
    r: redis.Redis, expected: Iterable[int], deadline_s: float, grace_s: float = 0.5, check: Any = None
) -> bool:
    """Wait (monotonic ``deadline_s``) until every expected seq has a record; then a short
    grace period to catch late duplicates. Returns whether all arrived."""
    want = set(expected)
    complete = False
    while time.monotonic() < deadline_s:
        if check:
            check()
        if r.llen(REC_KEY) >= len(want):
            seen = {seq for seq, _, _ in read_records(r)}
            if want <= seen:
                complete = True
                break
        time.sleep(0.05)
    time.sleep(grace_s)
    return complete


def analyze(dues: dict[int, float], records: list[tuple[int, float, int]]) -> dict[str, Any]:
    """Lateness (start − due) percentiles, lost, duplicated, unexpected — from the records."""
    first: dict[int, float] = {}
    counts: dict[int, int] = {}
    pids: dict[int, int] = {}
    unexpected = 0
    for seq, start, pid in records:
        if seq not in dues:
            unexpected += 1
            continue
        counts[seq] = counts.get(seq, 0) + 1
        pids[pid] = pids.get(pid, 0) + 1
        if seq not in first or start < first[seq]:
            first[seq] = start
    lateness = [first[s] - dues[s] for s in first]
    out = {
        "expected": len(dues),
        "ran": len(first),
        "lost": len(dues) - len(first),
        "duplicated": sum(c - 1 for c in counts.values()),
        "unexpected": unexpected,
        "early": sum(1 for x in lateness if x < -1.0),  # started more than 1 ms before its due time
        "lateness_ms": pct(lateness),
        "runs_per_pid": sorted(pids.values()),
    }
    if first:
        out["first_due_to_last_start_ms"] = max(first.values()) - min(dues.values())
        # The longest time between two consecutive starts: a fleet that stalls while
        # messages wait (a lost wake-up, a poll) shows here first (see benchmarks/README.md,
        # "A burst that waited for a poll").
        starts = sorted(first.values())
        out["longest_gap_ms"] = round(max((b - a for a, b in itertools.pairwise(starts)), default=0.0), 3)
    out["_lateness_samples"] = [round(x, 3) for x in lateness]
    return out


def pct(values: Sequence[float]) -> dict[str, float | None]:
    if not values:
        return {"n": 0, "min": None, "p50": None, "p90": None, "p99": None, "max": None, "mean": None}
    s = sorted(values)
    n = len(s)

    def q(p: float) -> float:
        return round(s[min(n - 1, max(0, math.ceil(p * n) - 1))], 3)

    return {
        "n": n,
        "min": round(s[0], 3),
        "p50": q(0.50),
        "p90": q(0.90),
        "p99": q(0.99),
        "max": round(s[-1], 3),
        "mean": round(statistics.fmean(s), 3),
    }


def inversions(seq: Sequence[int]) -> int:
    """Number of pairs out of order (Fenwick tree, O(n log n))."""
    ranks = {v: i + 1 for i, v in enumerate(sorted(set(seq)))}
    n = len(ranks)
    tree = [0] * (n + 1)
    inv = 0
    seen = 0
    for v in seq:
        r = ranks[v]
        # count seen elements greater than v
        i, le = r, 0
        while i > 0:
            le += tree[i]
            i -= i & -i
        inv += seen - le
        i = r
        while i <= n:
            tree[i] += 1
            i += i & -i
        seen += 1
    return inv


def median_merge(runs: list[Any]) -> Any:
    """Merge repeated runs of a scenario: the median of every number, the first run's anything else."""
    first = runs[0]
    if isinstance(first, bool) or first is None or isinstance(first, str):
        return first
    if isinstance(first, (int, float)):
        nums = [x for x in runs if isinstance(x, (int, float)) and not isinstance(x, bool)]
        return round(statistics.median(nums), 3) if nums else first
    if isinstance(first, dict):
        return {k: median_merge([r.get(k) for r in runs if isinstance(r, dict) and k in r]) for k in first}
    return first


#: Commands the harness itself runs during a measurement: the recorder's EVAL (one TIME
#: and one RPUSH inside each), INFO and CONFIG RESETSTAT; script calls (EVAL, EVALSHA, and
#: FCALL with the FUNCTION LOAD that loads its library) are wrappers, the commands they run
#: are counted by name.
_HARNESS = ("eval", "evalsha", "fcall", "function", "info", "config", "client", "hello", "script", "ping", "command")


def server_work(stats: dict[str, tuple[int, int]], n: int) -> dict[str, Any]:
    """Server commands per message from ``Server.commandstats()`` over a run of ``n``
    messages: every command run, inside scripts or not, but the harness's (the recorder's
    TIME and RPUSH per message are taken off). Also the busiest commands per message."""
    recorder = stats.get("eval", (0, 0))[0]
    counts = {name: calls for name, (calls, _) in stats.items() if name not in _HARNESS}
    counts["time"] = counts.get("time", 0) - recorder
    counts["rpush"] = counts.get("rpush", 0) - recorder
    total = sum(max(0, c) for c in counts.values())
    top = sorted(((c, name) for name, c in counts.items() if c > 0), reverse=True)[:8]
    # Time the server spent running the broker's scripts (EVALSHA: the product's and the
    # built-in broker's; the recorder's go through EVAL), commands inside them included:
    # the server work of the broker itself, without the per-call I/O that "server CPU"
    # also holds, and far less sensitive to a noisy machine.
    evalsha_calls, evalsha_us = stats.get("evalsha", (0, 0))
    fcall_calls, fcall_us = stats.get("fcall", (0, 0))  # the library's functions (issue 55)
    script_calls, script_us = evalsha_calls + fcall_calls, evalsha_us + fcall_us
    return {
        "commands_per_msg": round(total / n, 1) if n else None,
        "script_calls_per_msg": round(script_calls / n, 3) if n else None,
        "script_us_per_msg": round(script_us / n, 1) if n else None,
        "top_commands_per_msg": {name: round(c / n, 2) for c, name in top},
    }
