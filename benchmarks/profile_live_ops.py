"""What the live-fleet operations (issue 23) cost the server per message: the fetch and
ack scripts as installed against those of an earlier commit, and the installed ones with
each feature switched off in turn.

    python -m benchmarks.profile_live_ops [--before 594b58c] [--rounds 40] [--n 200] [--url URL] [--json out.json]

Every variant handles the same messages the same way on one server: ``n`` ready messages,
then one fetch of one message and its ack per message, as a consumer that never waits
(the heartbeat write left out). Variants take turns in small batches, in an order that
alternates each round, so a noisy machine's slow spells fall on all of them alike; the
report is the median over ``rounds`` of the server time per message spent in the two
scripts (INFO commandstats, EVALSHA: commands inside them included, I/O not).

Variants (the installed scripts, with one part cut out of their source):

- ``before``: the scripts of ``--before`` (read with ``git show``);
- ``installed``: as installed;
- ``no pause check``: without fetch.lua's ``EXISTS`` of the paused key;
- ``no fetch records``: without the fetch record (fetch.lua's ``TIME`` and ``HSET``,
  ack.lua's ``HDEL``) that "running now" reads;
- ``no history``: without ack.lua's count in the activity history (its ``BITFIELD``).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
from pathlib import Path
from typing import Any

from ._base import dumps, quiet_logging
from ._server import Server

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_BEFORE = "594b58c"  # the last commit without the live-fleet operations

#: Each cut: (variant, script, text as installed, its replacement).
CUTS: tuple[tuple[str, str, str, str], ...] = (
    # (without lanes, the pause is read on its own: the MGET with the flow's flag is the lanes')
    ("no pause check", "fetch", 'state = { redis.call("EXISTS", paused) == 1, false }', "state = { false, false }"),
    ("no fetch records", "fetch", '    redis.call("HSET", fetched, unpack(pairs))\n', ""),
    ("no fetch records", "fetch", '(now_ms or server_ms()) .. "|" .. ARGV[5]', '""'),
    ("no fetch records", "ack", '    redis.call("HDEL", KEYS[4], ARGV[1])\n', ""),
    ("no history", "ack", "record_history(KEYS[5], KEYS[6], now_ms, tonumber(ARGV[4]))", ""),
)

PAYLOAD = (
    b'{"queue_name":"q","actor_name":"a","args":[1],"kwargs":{},"options":{},"message_id":"x","message_timestamp":1}'
)


def _git_source(rev: str, name: str) -> bytes:
    from ._internals import LUA_FOLDERS

    for folder in LUA_FOLDERS:  # newest first: the scripts moved into scripts/lua/ (issue 48)
        out = subprocess.run(
            ["git", "-C", str(ROOT), "show", f"{rev}:dramatiq_redisson/{folder}/{name}.lua"],
            capture_output=True,
            timeout=10,
        )
        if out.returncode == 0 and out.stdout:
            break
    if out.returncode != 0 or not out.stdout:
        raise SystemExit(f"cannot read lua/{name}.lua at {rev}: {out.stderr.decode().strip()}")
    return out.stdout


def sources(before: str) -> dict[str, dict[str, bytes]]:
    """Variant -> script name -> source (includes written in)."""
    from ._internals import expand_includes, load_source

    installed = {name: load_source(name) for name in ("fetch", "ack")}
    variants = {
        "before": {name: expand_includes(_git_source(before, name)) for name in ("fetch", "ack")},
        "installed": installed,
    }
    for variant, name, text, replacement in CUTS:
        scripts = variants.setdefault(variant, dict(installed))
        if text.encode() not in scripts[name]:
            raise SystemExit(f"{variant}: {text!r} is not in the installed {name}.lua any more: update CUTS")
        scripts[name] = scripts[name].replace(text.encode(), replacement.encode())
    return variants


def run(server: Server, before: str, rounds: int, n: int) -> dict[str, Any]:
    r = server.r
    variants = sources(before)
    sha = {(v, name): r.script_load(src) for v, scripts in variants.items() for name, src in scripts.items()}
    k = {"ready": "p:q", "msgs": "p:q.msgs", "acks": "p:acks.w.q", "hb": "p:hb", "idle": "p:idle"}
    new_keys = ("p:paused", "p:fetched", "p:minutes", "p:hours")
    per_message: dict[str, list[float]] = {v: [] for v in variants}

    def usec() -> int:
        return int(r.info("commandstats").get("cmdstat_evalsha", {}).get("usec", 0))

    for rnd in range(rounds):
        order = list(variants) if rnd % 2 == 0 else list(reversed(variants))
        for v in order:
            ids = [f"{rnd}:{v}:{i}" for i in range(n)]
            with r.pipeline(transaction=False) as pipe:
                pipe.rpush(k["ready"], *ids)
                pipe.hset(k["msgs"], mapping=dict.fromkeys(ids, PAYLOAD))
                pipe.execute()
            t0 = usec()
            for _ in range(n):
                if v == "before":
                    got = r.evalsha(sha[(v, "fetch")], 5, *k.values(), 1, "w", "tok", "0")
                    r.evalsha(sha[(v, "ack")], 3, k["acks"], k["msgs"], k["hb"], got[0], "w", "0")
                else:
                    got = r.evalsha(
                        sha[(v, "fetch")], 7, *k.values(), *new_keys[:2], 1, "w", "tok", "0", "w|host:1:w:1"
                    )
                    r.evalsha(sha[(v, "ack")], 6, k["acks"], k["msgs"], k["hb"], *new_keys[1:], got[0], "w", "0", "1")
            per_message[v].append((usec() - t0) / n)
    medians = {v: round(statistics.median(xs), 2) for v, xs in per_message.items()}
    base = medians["before"]
    return {
        "before": before,
        "rounds": rounds,
        "n": n,
        "script_us_per_msg": medians,
        "vs_before_us": {v: round(m - base, 2) for v, m in medians.items()},
        "feature_us": {v: round(medians["installed"] - m, 2) for v, m in medians.items() if v.startswith("no ")},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.profile_live_ops", description=__doc__)
    parser.add_argument("--before", default=DEFAULT_BEFORE, help="the commit to compare with")
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--n", type=int, default=200, help="messages per variant and round")
    parser.add_argument("--url", default=None)
    parser.add_argument("--json", dest="json_out", default=None)
    args = parser.parse_args(argv)
    quiet_logging()
    server = Server(args.url)
    try:
        result = run(server, args.before, args.rounds, args.n)
    finally:
        server.stop()
    print(dumps(result))
    if args.json_out:
        Path(args.json_out).write_text(dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
