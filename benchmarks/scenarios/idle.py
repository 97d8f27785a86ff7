"""``idle``: how soon an idle worker picks up a message."""

from __future__ import annotations

import random
import time
from typing import Any

from .._measure import analyze, read_records, wait_records
from ._shared import Ctx, _add_ratio_rows, _lat_row


def idle_pickup(ctx: Ctx) -> dict[str, Any]:
    p = ctx.p["idle"]
    data: dict[str, Any] = {"params": p}
    rows = []
    for kind in [k for k in ctx.brokers if k != "redisson-lrem"]:  # no delay: the transfer plays no part
        ctx.server.flush()
        broker, actor = ctx.producer(kind)
        rng = random.Random(6)
        sent: dict[int, float] = {}
        ctx.log(f"idle/{kind}: {p['n']} messages sent to idle workers, {p['gap_lo']}-{p['gap_hi']} ms apart")
        with ctx.workers(kind) as w:
            time.sleep(p.get("settle", 2.0))  # idle: let the consumers back off
            for seq in range(p["n"]):
                time.sleep(rng.uniform(p["gap_lo"], p["gap_hi"]) / 1000)
                sent[seq] = time.time() * 1000  # same host: the server's TIME reads this clock
                actor.send(seq)
            complete = wait_records(ctx.r, sent, time.monotonic() + 30, check=w.check)
        ctx.check_crash("idle", kind, w)
        res = analyze(sent, read_records(ctx.r))
        res["complete"] = complete
        res["early"] = 0  # "due" here is the send time, taken just before send()
        ctx.check_delivery("idle", kind, res)
        data[kind] = res
        rows.append(_lat_row(kind, res))
        broker.close()
    _add_ratio_rows(rows, data)
    targets = []
    if "redisson" in data:
        lat = data["redisson"]["lateness_ms"]
        targets.append(
            {
                "target": "idle pickup p99 <= 5 ms",
                "value": lat["p99"],
                "met": lat["p99"] is not None and lat["p99"] <= 5,
            }
        )
    return {"data": data, "rows": rows, "targets": targets}
