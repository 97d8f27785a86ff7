"""``memory``: server memory per scheduled message and worker memory."""

from __future__ import annotations

import time
from typing import Any

from .._base import HOUR_MS
from .._brokers import bulk_offer
from .._workers import Workers
from ._shared import Ctx, _ratio


def _settled_rss(w: Workers, settle: float, limit: float = 30.0) -> list[int]:
    """Sample RSS until three samples in a row agree within 1 % (or ``limit`` seconds)."""
    time.sleep(settle)
    samples: list[list[int]] = []
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit:
        samples.append(w.rss())
        if len(samples) >= 3:
            last = [sum(s) for s in samples[-3:]]
            if max(last) - min(last) <= 0.01 * max(last):
                break
        time.sleep(0.5)
    return samples[-1]


def memory(ctx: Ctx) -> dict[str, Any]:
    p = ctx.p["memory"]
    data: dict[str, Any] = {"params": p}
    rows = []
    kinds = [k for k in ctx.brokers if k != "redisson-lrem"]  # same offer path and consumer as redisson
    for kind in kinds:
        # Pass A: server bytes per scheduled message, nothing else running.
        ctx.server.flush()
        broker, actor = ctx.producer(kind)
        base = ctx.server.used_memory()
        sample = actor.message(0)
        server_bytes: list[dict[str, Any]] = []
        done = 0
        for level in p["levels"]:
            ctx.log(f"memory/{kind}: server memory at {level} scheduled")
            bulk_offer(broker, kind, actor, list(range(done, level)), HOUR_MS)
            done = max(done, level)
            used = ctx.server.used_memory()
            server_bytes.append(
                {
                    "scheduled": level,
                    "used_memory": used,
                    "bytes_per_msg": round((used - base) / level, 1) if level else None,
                }
            )
        # Pass B: worker RSS with workers running while the backlog grows.
        ctx.server.flush()
        rss_levels: list[dict[str, Any]] = []
        done = 0
        with ctx.workers(kind) as w:
            for level in p["levels"]:
                ctx.log(f"memory/{kind}: worker RSS at {level} scheduled")
                bulk_offer(broker, kind, actor, list(range(done, level)), HOUR_MS)
                done = max(done, level)
                rss = _settled_rss(w, p["settle"])
                rss_levels.append(
                    {"scheduled": level, "rss_per_process": rss, "rss_max_mb": round(max(rss) / 2**20, 1)}
                )
        ctx.check_crash("memory", kind, w)
        data[kind] = {"server": server_bytes, "rss": rss_levels, "encoded_message_bytes": len(sample.encode())}
        for sb, rs in zip(server_bytes, rss_levels, strict=False):
            rows.append(
                {
                    "broker": kind,
                    "scheduled": sb["scheduled"],
                    "server bytes/msg": sb["bytes_per_msg"],
                    "worker RSS MB (max of procs)": rs["rss_max_mb"],
                }
            )
        broker.close()
    targets = []
    if "redisson" in data:
        rs = data["redisson"]["rss"]
        growth = rs[-1]["rss_max_mb"] - rs[0]["rss_max_mb"]
        targets.append(
            {
                "target": "worker RSS independent of number scheduled (growth < 5 MB)",
                "value": f"{rs[0]['rss_max_mb']} -> {rs[-1]['rss_max_mb']} MB",
                "met": growth < 5,
            }
        )
        if "builtin" in data:
            mine = data["redisson"]["server"][-1]["bytes_per_msg"]
            theirs = data["builtin"]["server"][-1]["bytes_per_msg"]
            ratio = _ratio(mine, theirs)
            for row in rows:
                if row["broker"] == "redisson":
                    other = next(
                        (r for r in rows if r["broker"] == "builtin" and r["scheduled"] == row["scheduled"]), None
                    )
                    if other:
                        row["bytes vs builtin"] = _ratio(row["server bytes/msg"], other["server bytes/msg"])
            ok = ratio is not None and mine > 0 and theirs > 0
            targets.append(
                {
                    "target": "server bytes per scheduled message <= 300 B and <= 0.7 x built-in (issue 21)",
                    "value": f"{mine} vs {theirs} = {ratio}x",
                    "met": (ratio is not None and mine <= 300 and ratio <= 0.7) if ok else None,
                }
            )
    return {"data": data, "rows": rows, "targets": targets}
