"""Profile RedissonBroker's transfer script: the installed one and the one before commit
c9e3a71 (per-entry commands; read with ``git show``).

    python -m benchmarks.profile_transfer [--n 100000] [--backlogs 0,1000000] [--url URL] [--json out.json]

For each script and backlog: ``backlog`` messages due in 1 h are offered first (enqueue_many),
then ``n`` messages due at once; this process calls the script in a loop (limit 100, the
broker's defaults otherwise) until all ``n`` moved. Reported: server time per moved message
(INFO commandstats, EVALSHA), the longest call (SLOWLOG, 100 µs threshold), wall time; and
a profile of one 100-entry call: the commands it ran (SLOWLOG with threshold 0 logs the
commands a script runs as entries of their own).
"""

from __future__ import annotations

import argparse
import time
from collections import Counter
from pathlib import Path
from typing import Any

from ._base import HOUR_MS, QUEUE, dumps, quiet_logging
from ._brokers import bulk_offer, make_broker
from ._server import Server

BEFORE = "879be2a"  # the last commit with the per-entry transfer.lua


def _before_source() -> bytes | None:
    import subprocess

    out = subprocess.run(
        ["git", "-C", str(Path(__file__).parent.parent), "show", f"{BEFORE}:dramatiq_redisson/lua/transfer.lua"],
        capture_output=True,
        timeout=10,
    )
    return out.stdout if out.returncode == 0 and out.stdout else None


def _keys(k: Any) -> list[str]:
    return [
        k.timeout_zset,
        k.backup_list,
        k.payloads,
        k.compact_list,
        k.compact_cursor,
        k.ready,
        k.ready_msgs,
        k.xq,
        k.xq_msgs,
    ]


def _args(limit: int = 100) -> list[int]:
    from ._internals import COMPACT_SLACK, COMPACT_STEP, TRIM_BUDGET

    return [limit, TRIM_BUDGET, COMPACT_STEP, COMPACT_SLACK]


def _fill(server: Server, backlog: int, n: int) -> tuple[Any, Any]:
    from ._actor import declare

    server.flush()
    broker = make_broker("redisson", server.url)
    actor = declare(broker)
    bulk_offer(broker, "redisson", actor, list(range(1_000_000_000, 1_000_000_000 + backlog)), HOUR_MS)
    bulk_offer(broker, "redisson", actor, list(range(n)), 1, chunk=max(n, 1))
    time.sleep(0.2)
    return broker, broker.keys(QUEUE)


def _script(broker: Any, variant: str) -> Any:
    if variant == "installed":
        return broker.redisson_scripts._s["transfer"]
    return broker.client.register_script(_before_source())


def _variants() -> list[str]:
    return ["installed"] + ([f"before-{BEFORE}"] if _before_source() else [])


def run_one(server: Server, variant: str, backlog: int, n: int) -> dict[str, Any]:
    broker, keys = _fill(server, backlog, n)
    script = _script(broker, variant)
    script(keys=_keys(keys), args=_args(0))  # load the script; moves nothing
    server.slowlog_on()
    moved = calls = 0
    t0 = time.monotonic()
    while moved < n:
        m, _, _, dead = script(keys=_keys(keys), args=_args())
        moved += int(m) + int(dead)
        calls += 1
        if int(m) + int(dead) == 0:
            break
    wall = time.monotonic() - t0
    _, usec = server.evalsha_stats()
    entries, _ = server.slowlog()
    server.slowlog_off()
    longest = max((d for d, argv in entries if argv and argv[0].upper() == b"EVALSHA"), default=0)
    ready = server.r.llen(keys.ready)
    broker.close()
    return {
        "variant": variant,
        "backlog": backlog,
        "n": n,
        "moved": moved,
        "ready": ready,
        "calls": calls,
        "us_per_moved": round(usec / max(moved, 1), 3),
        "longest_call_ms": round(longest / 1000, 3),
        "wall_s": round(wall, 3),
    }


def profile_one_call(server: Server, variant: str) -> dict[str, Any]:
    broker, keys = _fill(server, 0, 100)
    script = _script(broker, variant)
    script(keys=_keys(keys), args=_args(0))
    server.slowlog_on(slower_than_us=0)
    script(keys=_keys(keys), args=_args())
    entries, _ = server.slowlog()
    server.slowlog_off()
    broker.close()
    inner = Counter(
        argv[0].decode().upper()
        for _, argv in entries
        if argv and argv[0].upper() not in (b"EVALSHA", b"SLOWLOG", b"CONFIG")
    )
    return {"variant": variant, "commands_in_one_100_entry_call": sum(inner.values()), "by_command": dict(inner)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.profile_transfer")
    parser.add_argument("--n", type=int, default=100_000)
    parser.add_argument("--backlogs", default="0,1000000")
    parser.add_argument("--url", default=None)
    parser.add_argument("--json", dest="json_out", default=None)
    args = parser.parse_args(argv)
    quiet_logging()
    server = Server(args.url)
    out: dict[str, Any] = {"runs": [], "profiles": []}
    try:
        for variant in _variants():
            out["profiles"].append(profile_one_call(server, variant))
            print(out["profiles"][-1], flush=True)
        for backlog in [int(x) for x in args.backlogs.split(",")]:
            for variant in _variants():
                out["runs"].append(run_one(server, variant, backlog, args.n))
                print(out["runs"][-1], flush=True)
    finally:
        server.stop()
    if args.json_out:
        Path(args.json_out).write_text(dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
