"""``head-of-line``: messages due soon behind many due much later."""

from __future__ import annotations

import time
from typing import Any

from .._base import HOUR_MS, PRODUCT_KINDS
from .._brokers import bulk_offer, due_of
from .._measure import analyze, read_records, wait_records
from ._shared import Ctx, _add_ratio_rows, _lat_row


def head_of_line(ctx: Ctx) -> dict[str, Any]:
    p = ctx.p["hol"]
    data: dict[str, Any] = {"params": p}
    rows = []
    # A control run without the backlog tells what the backlog itself costs: the near
    # messages come due faster than 2 processes x 4 threads can run them, so some
    # queueing shows up with or without anything scheduled ahead.
    plan = [(kind, p["far"], kind) for kind in ctx.brokers]
    if "redisson" in ctx.brokers:
        plan.append(("redisson", 0, "redisson (control: nothing scheduled ahead)"))
    for kind, n_far, label in plan:
        ctx.server.flush()
        broker, actor = ctx.producer(kind)
        ctx.log(f"head-of-line/{label}: {n_far} due in 1 h, then {p['near']} due in {p['near_delay']} ms")
        t0 = time.monotonic()
        far = list(range(1_000_000_000, 1_000_000_000 + n_far))
        bulk_offer(broker, kind, actor, far, HOUR_MS)
        fill_s = time.monotonic() - t0
        dues: dict[int, float] = {}
        with ctx.workers(kind) as w:
            time.sleep(1.0)  # let the built-in workers prefetch their delay queue
            t1 = time.monotonic()
            for seq in range(p["near"]):
                m = actor.send_with_options(args=(seq,), delay=p["near_delay"])
                dues[seq] = due_of(broker, kind, m)
            near_rate = round(p["near"] / (time.monotonic() - t1))
            # The window: the built-in broker is given a bounded time; so is ours (same window).
            deadline = time.monotonic() + max(0.0, (max(dues.values()) - ctx.server.now_ms()) / 1000) + p["window"]
            complete = wait_records(ctx.r, dues, deadline, check=w.check)
        ctx.check_crash("head-of-line", kind, w)
        records = read_records(ctx.r)
        far_ran = sum(1 for seq, _, _ in records if seq >= 1_000_000_000)
        res = analyze(dues, [rec for rec in records if rec[0] < 1_000_000_000])
        res.update(
            {
                "complete": complete,
                "window_s": p["window"],
                "far_ran": far_ran,
                "fill_seconds": round(fill_s, 2),
                "scheduled_ahead": n_far,
                "near_offered_per_s": near_rate,
            }
        )
        if kind in PRODUCT_KINDS and far_ran:
            ctx.fail(f"head-of-line/{kind}: {far_ran} far-future messages ran early")
        ctx.check_delivery("head-of-line", kind, res)
        data[label] = res
        row = _lat_row(kind, res, **{"not run in window": res["lost"], "far ran": far_ran})
        row["broker"] = label
        row["ahead"] = n_far
        row["near offered/s"] = near_rate
        rows.append(row)
        broker.close()
    _add_ratio_rows(rows, data)
    targets = []
    if "redisson" in data:
        lat = data["redisson"]["lateness_ms"]
        targets.append(
            {
                "target": "head-of-line near p99 <= 5 ms",
                "value": lat["p99"],
                "met": lat["p99"] is not None and lat["p99"] <= 5 and data["redisson"]["lost"] == 0,
            }
        )
    return {"data": data, "rows": rows, "targets": targets}
