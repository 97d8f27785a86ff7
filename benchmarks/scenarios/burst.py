"""``burst``: many messages due at once."""

from __future__ import annotations

import json
import time
from typing import Any

from .._base import PRODUCT_KINDS, QUEUE
from .._measure import inversions
from ._shared import Ctx, _move_measure


def _ready_order(ctx: Ctx) -> list[int]:
    """Seqs of the messages in the ready list, head first."""
    ready = f"dramatiq:{QUEUE}"
    ids = ctx.r.lrange(ready, 0, -1)
    seqs: list[int] = []
    for start in range(0, len(ids), 5000):
        part = ids[start : start + 5000]
        for raw in ctx.r.hmget(f"{ready}.msgs", part):
            seqs.append(json.loads(raw)["args"][0] if raw is not None else -1)
    return seqs


def _burst_one(ctx: Ctx, kind: str, variant: str, p: dict[str, Any]) -> dict[str, Any]:
    ctx.server.flush()
    broker, actor = ctx.producer(kind)
    n = p["n"]
    with ctx.workers(kind, mode="move") as w:
        time.sleep(0.5)
        res = _move_measure(ctx, broker, kind, actor, list(range(n)), p["delay"], p["timeout"], variant)
        w.check()
    ctx.check_crash("burst", kind, w)
    order = _ready_order(ctx)
    pairs = len(order) * (len(order) - 1) // 2
    inv = inversions(order) if order else 0
    counts: dict[int, int] = {}
    for s in order:
        counts[s] = counts.get(s, 0) + 1
    res.update(
        {
            "variant": variant,
            "lost": n - len(counts),
            "duplicated": sum(c - 1 for c in counts.values()),
            "inversions": inv,
            "inversion_fraction": round(inv / pairs, 6) if pairs else 0.0,
            "adjacent_inversions": sum(1 for a, b in zip(order, order[1:], strict=False) if b < a),
            "_order_sample": order[:: max(1, len(order) // 2000)],
        }
    )
    if kind in PRODUCT_KINDS:
        if res["lost"]:
            ctx.fail(f"burst/{kind}/{variant}: {res['lost']} messages not moved")
        if res["duplicated"]:
            ctx.fail(f"burst/{kind}/{variant}: {res['duplicated']} messages moved twice")
    broker.close()
    return res


def burst(ctx: Ctx) -> dict[str, Any]:
    p = ctx.p["burst"]
    data: dict[str, Any] = {"params": p}
    rows = []
    for kind in ctx.brokers:
        variants = ["pipelined_eta"] if kind == "builtin" else ["enqueue_many", "same_ms"]
        data[kind] = {}
        for variant in variants:
            ctx.log(f"burst/{kind}/{variant}: {p['n']} messages due at once, moved by idle workers")
            res = _burst_one(ctx, kind, variant, p)
            data[kind][variant] = res
            rows.append(
                {
                    "broker": kind,
                    "offer": variant,
                    "distinct due ms": res["distinct_due_ms"],
                    "moved": f"{res['moved']}/{res['n']}",
                    "due spread ms": res["due_spread_ms"],
                    "all moved after first due ms": res["move_all_after_first_due_ms"],
                    "after last due ms": res["move_all_after_last_due_ms"],
                    "script ms total": res["script_ms_total"],
                    "script us/msg": res["script_us_per_moved"],
                    "longest call ms": res["longest_call_ms"],
                    "inversions": res["inversion_fraction"],
                    "lost": res["lost"],
                    "dup": res["duplicated"],
                }
            )
    targets = []
    if "redisson" in data:
        for variant, res in data["redisson"].items():
            # From the FIRST due time: with enqueue_many the due times spread over the offer.
            t = res["move_all_after_first_due_ms"]
            targets += [
                {
                    "target": f"burst ({variant}): {res['n']} moved in <= 2 s after the first due time",
                    "value": t,
                    "met": t is not None and t <= 2000,
                },
                {
                    "target": f"burst ({variant}): FIFO (no inversions)",
                    "value": res["inversion_fraction"],
                    "met": res["inversions"] == 0,
                },
                {
                    "target": f"burst ({variant}): no call > 5 ms",
                    "value": res["longest_call_ms"],
                    "met": res["longest_call_ms"] <= 5,
                },
            ]
    return {"data": data, "rows": rows, "targets": targets}
