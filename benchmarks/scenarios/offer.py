"""``offer``: one-by-one and bulk enqueue throughput."""

from __future__ import annotations

import statistics
import time
from typing import Any

from .._base import QUEUE
from .._brokers import queue_keys
from ._shared import Ctx, _ratio


def offer_throughput(ctx: Ctx) -> dict[str, Any]:
    import multiprocessing as mp

    from .._child import offer_main

    p = ctx.p["offer"]
    plan = []
    if "redisson" in ctx.brokers:
        plan += [("redisson", "one", p["one"]), ("redisson", "keyed", p["one"]), ("redisson", "bulk", p["bulk"])]
    if "builtin" in ctx.brokers:
        plan += [("builtin", "one", p["one"])]
    spawn = mp.get_context("spawn")
    runs: dict[str, list[dict[str, Any]]] = {}
    for rep in range(p["repeat"]):
        for kind, mode, n in plan:
            ctx.server.flush()
            ctx.log(f"offer/{kind}/{mode}: {n} delayed messages from one producer process (run {rep + 1})")
            out = spawn.Queue()
            proc = spawn.Process(target=offer_main, args=(kind, ctx.server.url, mode, n, out), daemon=True)
            proc.start()
            try:
                res = _result_of(proc, out, 600)
            finally:
                proc.join(30)
                if proc.is_alive():
                    proc.kill()
                    proc.join(5)
            if proc.exitcode not in (0, None):
                ctx.fail(f"offer/{kind}/{mode}: producer exited with code {proc.exitcode}")
            stored = int(
                ctx.r.zcard(queue_keys(kind).timeout_zset) if kind != "builtin" else ctx.r.llen(f"dramatiq:{QUEUE}.DQ")
            )
            res["stored"] = stored
            if stored != n + 1:
                ctx.fail(f"offer/{kind}/{mode}: {stored} scheduled after offering {n + 1}")
            if mode == "keyed" and int(ctx.r.hlen(queue_keys(kind).dedupe)) != n:
                ctx.fail(f"offer/{kind}/{mode}: {ctx.r.hlen(queue_keys(kind).dedupe)} keys indexed after {n} sends")
            runs.setdefault(f"{kind}/{mode}", []).append(res)

    data: dict[str, Any] = {"params": p, "runs": runs}
    med = {k: statistics.median(r["rate"] for r in v) for k, v in runs.items()}
    data["median_rate"] = med
    rows = []
    for k, v in runs.items():
        row = {
            "broker/mode": k,
            "msgs": v[0]["n"],
            "msgs/s (median)": round(med[k]),
            "runs": ", ".join(str(round(r["rate"])) for r in v),
        }
        if "rate_incl_build" in v[0]:
            row["msgs/s incl. building messages"] = round(statistics.median(r["rate_incl_build"] for r in v))
        if "builtin/one" in med and k != "builtin/one":
            row["vs builtin one-by-one"] = _ratio(med[k], med["builtin/one"])
        if k == "redisson/keyed" and "redisson/one" in med:
            row["keyed vs plain"] = _ratio(med[k], med["redisson/one"])
        rows.append(row)
    targets = []
    for ours, theirs, target in (
        ("redisson/one", "builtin/one", "one-by-one offer >= 0.9 x built-in delayed enqueue"),
        ("redisson/keyed", "redisson/one", "keyed offer (dedupe_key, keep) >= 0.9 x plain one-by-one offer"),
    ):
        if ours in med and theirs in med:
            ratio = _ratio(med[ours], med[theirs])
            targets.append({"target": target, "value": f"{ratio}x", "met": ratio is not None and ratio >= 0.9})
    if "redisson/bulk" in med:
        targets.append(
            {
                "target": "bulk (enqueue_many) >= 50 000 msgs/s",
                "value": round(med["redisson/bulk"]),
                "met": med["redisson/bulk"] >= 50_000,
            }
        )
    return {"data": data, "rows": rows, "targets": targets}


def _result_of(proc: Any, out: Any, timeout: float) -> dict[str, Any]:
    """The producer's report, or an error as soon as it exits without one (a crash ends the
    wait at once instead of after ``timeout``)."""
    import queue

    deadline = time.monotonic() + timeout
    while True:
        try:
            return dict(out.get(timeout=0.5))
        except queue.Empty:
            if not proc.is_alive():
                raise RuntimeError(f"the producer process exited with code {proc.exitcode} without a report") from None
            if time.monotonic() > deadline:
                raise
