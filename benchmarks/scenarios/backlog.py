"""``backlog``: the cost of moving due messages with a large backlog scheduled."""

from __future__ import annotations

import time
from typing import Any

from .._base import HOUR_MS, QUEUE
from .._brokers import bulk_offer, script_names
from .._internals import reference_lua
from .._measure import analyze, classify_slowlog, longest_call, read_records, wait_records
from ._shared import Ctx, _move_measure, _offer_due


def _fill_reference(ctx: Ctx, far: int, due: int) -> None:
    """Fill Redisson's structures directly: ``far`` entries due in 1 h offered first, then
    ``due`` entries already due. Members look like ours: 16-char key + a uuid-sized id."""
    from .._brokers import queue_keys

    keys = queue_keys("redisson")
    now = int(ctx.server.now_ms())
    chunk = 5000

    def put(start: int, count: int, score: int) -> None:
        for s in range(start, start + count, chunk):
            members = [f"{i:016x}{i:036d}" for i in range(s, min(start + count, s + chunk))]
            with ctx.r.pipeline(transaction=False) as pipe:
                pipe.zadd(keys.timeout_zset, {m: score for m in members})
                pipe.rpush(keys.backup_list, *members)
                pipe.execute()

    put(0, far, now + HOUR_MS)
    put(far, due, now - 1)


def _reference(ctx: Ctx, level: int, p: dict[str, Any]) -> dict[str, Any]:
    """Redisson's original transfer (reference .lua), called in a loop by this process."""
    from .._brokers import queue_keys

    keys = queue_keys("redisson")
    ctx.server.flush()
    _fill_reference(ctx, level, p["due"])
    script = ctx.r.register_script(reference_lua())
    script(keys=[f"{keys.name}:reference-target", f"{keys.name}:none", f"{keys.name}:none"], args=[0])  # load it
    ctx.server.slowlog_on()
    moved = calls = 0
    t0 = time.monotonic()
    while moved < p["due"] and time.monotonic() - t0 < p["ref_budget"]:
        n, _, _, _ = script(keys=[f"{keys.name}:reference-target", keys.timeout_zset, keys.backup_list], args=[100])
        moved += int(n)
        calls += 1
    wall = time.monotonic() - t0
    _, usec = ctx.server.evalsha_stats()
    entries, overflow = ctx.server.slowlog()
    ctx.server.slowlog_off()
    longest = longest_call(classify_slowlog(entries, {}))
    per_msg = usec / moved if moved else None
    return {
        "backlog": level,
        "moved": moved,
        "calls": calls,
        "wall_s": round(wall, 3),
        "script_us_per_moved": round(per_msg, 3) if per_msg is not None else None,
        "longest_call_ms": round(longest["max_us"] / 1000, 3),
        "projected_all_s": round(per_msg * p["due"] / 1e6, 2) if per_msg is not None else None,
        "complete": moved >= p["due"],
        "slowlog_overflow": overflow,
    }


def backlog_cost(ctx: Ctx) -> dict[str, Any]:
    p = ctx.p["backlog"]
    data: dict[str, Any] = {"params": p}
    rows = []
    ready = f"dramatiq:{QUEUE}"
    for kind in ctx.brokers:
        if kind == "redisson-lrem":
            data[kind] = levels = []
            for level in p["levels"]:
                ctx.log(f"backlog/{kind} (reference transfer, no workers): {level} scheduled ahead, {p['due']} due")
                res = _reference(ctx, level, p)
                levels.append(res)
                rows.append(
                    {
                        "broker": "redisson-original (reference)",
                        "backlog": level,
                        "moved": f"{res['moved']}/{p['due']}",
                        "transfer us/msg": res["script_us_per_moved"],
                        "longest call ms": res["longest_call_ms"],
                        "all moved s": res["wall_s"] if res["complete"] else f"~{res['projected_all_s']} (projected)",
                    }
                )
            continue
        data[kind] = levels = []
        for level in p["levels"]:
            ctx.server.flush()
            broker, actor = ctx.producer(kind)
            budget = p["window"] if kind == "builtin" else p["timeout"]
            ctx.log(f"backlog/{kind}: {level} scheduled ahead")
            t0 = time.monotonic()
            bulk_offer(broker, kind, actor, list(range(1_000_000_000, 1_000_000_000 + level)), HOUR_MS)
            fill_s = time.monotonic() - t0
            # (a) Moving only: workers that move due messages and run nothing.
            ctx.log(f"backlog/{kind}: {level} scheduled ahead, {p['due']} due at once, moved by idle workers")
            with ctx.workers(kind, mode="move") as w:
                time.sleep(1.0)
                move = _move_measure(
                    ctx, broker, kind, actor, list(range(2_000_000_000, 2_000_000_000 + p["due"])), p["delay"], budget
                )
            ctx.check_crash("backlog", kind, w)
            if kind != "builtin" and not move["all_moved"]:
                ctx.fail(f"backlog/{kind}: only {move['moved']} of {p['due']} moved within {budget} s")
            ctx.r.delete(ready, f"{ready}.msgs")
            # (b) Delivery: ordinary workers run them; script time covers transfer, fetch, ack.
            ctx.log(f"backlog/{kind}: {level} scheduled ahead, {p['due']} due at once, run by workers")
            with ctx.workers(kind) as w:
                time.sleep(1.0)
                ctx.server.slowlog_on()
                dues, _ = _offer_due(ctx, broker, kind, actor, list(range(p["due"])), p["delay"])
                offered_at = ctx.server.now_ms()
                ctx.server.reset_stats()  # count delivery only, not the offers
                deadline = time.monotonic() + max(0.0, (max(dues.values()) - ctx.server.now_ms()) / 1000) + budget
                complete = wait_records(ctx.r, dues, deadline, grace_s=0.3, check=w.check)
                calls, usec = ctx.server.evalsha_stats()
                entries, overflow = ctx.server.slowlog()
                ctx.server.slowlog_off()
            ctx.check_crash("backlog", kind, w)
            longest = longest_call(classify_slowlog(entries, script_names(broker)))
            res = analyze(dues, [rec for rec in read_records(ctx.r) if rec[0] < 1_000_000_000])
            delivered = res["ran"]
            res.update(
                {
                    "backlog": level,
                    "fill_seconds": round(fill_s, 2),
                    "complete": complete,
                    "move_only": move,
                    "offer_overlapped_due": offered_at >= min(dues.values()),
                    "due_spread_ms": max(dues.values()) - min(dues.values()),
                    "script_us_per_delivered": round(usec / delivered, 3) if delivered else None,
                    "script_calls": calls,
                    "longest_call_ms": round(longest["max_us"] / 1000, 3),
                    "longest_call_by": longest["by"],
                    "slowlog_overflow": overflow,
                }
            )
            ctx.check_delivery("backlog", kind, res, complete_required=kind != "builtin")
            levels.append(res)
            rows.append(
                {
                    "broker": kind,
                    "backlog": level,
                    "moved": f"{move['moved']}/{p['due']}",
                    "transfer us/msg": move["script_us_per_moved"],
                    "longest call ms": max(move["longest_call_ms"], res["longest_call_ms"]),
                    "all moved s": round(move["move_all_after_first_due_ms"] / 1000, 3)
                    if move["all_moved"]
                    else f"no ({budget} s window)",
                    "delivered": f"{delivered}/{p['due']}",
                    "scripts us/delivered": res["script_us_per_delivered"],
                    "all started s": round(res["first_due_to_last_start_ms"] / 1000, 3)
                    if complete and "first_due_to_last_start_ms" in res
                    else f"no ({budget} s window)",
                    "p99 ms": res["lateness_ms"]["p99"],
                    "longest gap ms": res.get("longest_gap_ms"),
                    "dup": res["duplicated"],
                }
            )
            broker.close()
    return {"data": data, "rows": rows, "targets": _targets(data)}


def _targets(data: dict[str, Any]) -> list[dict[str, Any]]:
    """The scenario's targets, from RedissonBroker's largest backlog."""
    targets: list[dict[str, Any]] = []
    if data.get("redisson"):
        top = data["redisson"][-1]
        per = top["move_only"]["script_us_per_moved"]
        longest = max(top["move_only"]["longest_call_ms"], top["longest_call_ms"])
        targets += [
            {
                "target": f"transfer script time per moved message <= 20 us at {top['backlog']} scheduled",
                "value": per,
                "met": per is not None and per <= 20,
            },
            {
                "target": f"(all scripts incl. fetch/ack per delivered message at {top['backlog']} scheduled)",
                "value": top["script_us_per_delivered"],
                "met": None,
            },
            {
                "target": f"no single script call > 5 ms at {top['backlog']} scheduled",
                "value": longest,
                "met": longest <= 5,
            },
        ]
    return targets
