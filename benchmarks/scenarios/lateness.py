"""``lateness`` and ``lateness-paced``: how late delayed messages run, side by side."""

from __future__ import annotations

import random
import time
from typing import Any

from .._common import due_of
from .._measure import analyze, read_records, server_work, wait_records
from ._shared import Ctx, _add_ratio_rows, _lat_row, _ratio


def lateness(ctx: Ctx, which: str = "lateness") -> dict[str, Any]:
    """How late delayed messages run; with each broker's server CPU and server commands per
    message over the run (workers idle-polling included, the recorder's commands not)."""
    p = ctx.p[which]
    pace = p.get("rate")  # offers per second, or None: as fast as one producer goes
    data: dict[str, Any] = {"params": p}
    rows = []
    for kind in ctx.brokers:
        ctx.server.flush()
        broker, actor = ctx.producer(kind)
        rng = random.Random(20_000)
        dues: dict[int, float] = {}
        ctx.log(
            f"{which}/{kind}: {p['n']} messages, delays {p['delay_lo']}-{p['delay_hi']} ms"
            + (f", offered at {pace}/s" if pace else "")
        )
        with ctx.workers(kind) as w:
            ctx.server.reset_stats()
            cpu0 = ctx.server.cpu_seconds()
            t0 = time.monotonic()
            for seq in range(p["n"]):
                if pace:
                    time.sleep(max(0.0, t0 + seq / pace - time.monotonic()))
                m = actor.send_with_options(args=(seq,), delay=rng.randint(p["delay_lo"], p["delay_hi"]))
                dues[seq] = due_of(broker, kind, m)
            offer_s = time.monotonic() - t0
            deadline = time.monotonic() + max(0.0, (max(dues.values()) - ctx.server.now_ms()) / 1000) + p["timeout"]
            complete = wait_records(ctx.r, dues, deadline, check=w.check)
            cpu_s = ctx.server.cpu_seconds() - cpu0
            per_message = server_work(ctx.server.commandstats(), p["n"])
        ctx.check_crash(which, kind, w)
        res = analyze(dues, read_records(ctx.r))
        res.update({"offer_seconds": round(offer_s, 3), "offer_rate": round(p["n"] / offer_s), "complete": complete})
        res.update(per_message, server_cpu_us_per_msg=round(cpu_s * 1e6 / p["n"], 1))
        ctx.check_delivery(which, kind, res)
        data[kind] = res
        rows.append(
            _lat_row(
                kind,
                res,
                early=res["early"],
                **{
                    "offered/s": res["offer_rate"],
                    "server CPU us/msg": res["server_cpu_us_per_msg"],
                    "commands/msg": res["commands_per_msg"],
                    "script us/msg": res["script_us_per_msg"],
                },
            )
        )
        broker.close()
    _add_ratio_rows(rows, data)
    if "redisson" in data and "builtin" in data:
        for row in rows:
            if row["broker"] == "redisson":
                ours, theirs = data["redisson"], data["builtin"]
                row["CPU vs builtin"] = _ratio(ours["server_cpu_us_per_msg"], theirs["server_cpu_us_per_msg"])
                row["commands vs builtin"] = _ratio(ours["commands_per_msg"], theirs["commands_per_msg"])
                row["script us vs builtin"] = _ratio(ours["script_us_per_msg"], theirs["script_us_per_msg"])
    targets = []
    if "redisson" in data:
        lat = data["redisson"]["lateness_ms"]
        label = "" if which == "lateness" else f" ({which})"
        targets += [
            {
                "target": f"lateness p99 <= 5 ms{label}",
                "value": lat["p99"],
                "met": lat["p99"] is not None and lat["p99"] <= 5,
            },
            {
                "target": f"lateness max <= 50 ms{label}",
                "value": lat["max"],
                "met": lat["max"] is not None and lat["max"] <= 50,
            },
        ]
    return {"data": data, "rows": rows, "targets": targets}


def lateness_paced(ctx: Ctx) -> dict[str, Any]:
    """Lateness with offers paced well below the workers' capacity: the delay machinery's
    own precision, without the queueing the full-speed scenario adds."""
    return lateness(ctx, "lateness_paced")
