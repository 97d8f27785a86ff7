"""The scenarios. Each returns ``{"data": …, "rows": […], "targets": […]}`` and reports
failures (lost or duplicated messages of the Redisson brokers, crashes) through ``ctx.fail``."""

from __future__ import annotations

import json
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ._actor import declare
from ._common import (
    HOUR_MS,
    NAMESPACE,
    PRODUCT_KINDS,
    QUEUE,
    REC_KEY,
    SLOWLOG_THRESHOLD_US,
    CommandCounter,
    Server,
    ServerGroup,
    Workers,
    analyze,
    bulk_offer,
    classify_slowlog,
    counter_slots,
    due_of,
    inversions,
    longest_call,
    make_broker,
    median_merge,
    pct,
    queue_keys,
    read_records,
    reference_lua,
    script_names,
    wait_records,
)


class Ctx:
    def __init__(
        self, server: Server, size: str, params: dict[str, Any], brokers: list[str], log: Callable[[str], None]
    ) -> None:
        self.server, self.size, self.p, self.brokers, self.log = server, size, params, brokers, log
        self.failures: list[str] = []

    @property
    def r(self) -> Any:
        return self.server.r

    def fail(self, msg: str) -> None:
        self.log("FAILURE: " + msg)
        self.failures.append(msg)

    def producer(self, kind: str) -> tuple[Any, Any]:
        broker = make_broker(kind, self.server.url)
        return broker, declare(broker)

    def workers(self, kind: str, mode: str = "run") -> Workers:
        return Workers(kind, self.server.url, self.p["procs"], self.p["threads"], mode)

    def check_delivery(self, scenario: str, kind: str, res: dict[str, Any], complete_required: bool = True) -> None:
        if kind in PRODUCT_KINDS:
            if res.get("duplicated"):
                self.fail(f"{scenario}/{kind}: {res['duplicated']} duplicated messages")
            if complete_required and res.get("lost"):
                self.fail(f"{scenario}/{kind}: {res['lost']} lost messages")
            if res.get("unexpected"):
                self.fail(f"{scenario}/{kind}: {res['unexpected']} messages that should not have run ran")
            if res.get("early"):
                self.fail(f"{scenario}/{kind}: {res['early']} messages started before their due time")

    def check_crash(self, scenario: str, kind: str, workers: Workers) -> None:
        for msg in workers.crashed:
            self.fail(f"{scenario}/{kind}: {msg}")


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return round(a / b, 4)


def _r(x: float | None, digits: int = 0) -> float | int | None:
    """``x`` rounded for a target's text."""
    if x is None:
        return None
    return round(x, digits) if digits else round(x)


def _lat_row(kind: str, res: dict[str, Any], **extra: Any) -> dict[str, Any]:
    lat = res["lateness_ms"]
    row = {
        "broker": kind,
        "ran": f"{res['ran']}/{res['expected']}",
        "lost": res["lost"],
        "dup": res["duplicated"],
        "p50 ms": lat["p50"],
        "p90 ms": lat["p90"],
        "p99 ms": lat["p99"],
        "max ms": lat["max"],
    }
    row.update(extra)
    return row


def _add_ratio_rows(rows: list[dict[str, Any]], data: dict[str, Any], key: str = "lateness_ms") -> None:
    base = data.get("builtin")
    if not base:
        return
    for row in rows:
        kind = row["broker"]
        if kind == "builtin" or kind not in data:
            continue
        mine = data[kind][key]
        row["p99 vs builtin"] = _ratio(mine["p99"], base[key]["p99"])
        row["p50 vs builtin"] = _ratio(mine["p50"], base[key]["p50"])


# -- 1. lateness -----------------------------------------------------------------------


def lateness(ctx: Ctx, which: str = "lateness") -> dict[str, Any]:
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
            t0 = time.monotonic()
            for seq in range(p["n"]):
                if pace:
                    time.sleep(max(0.0, t0 + seq / pace - time.monotonic()))
                m = actor.send_with_options(args=(seq,), delay=rng.randint(p["delay_lo"], p["delay_hi"]))
                dues[seq] = due_of(broker, kind, m)
            offer_s = time.monotonic() - t0
            deadline = time.monotonic() + max(0.0, (max(dues.values()) - ctx.server.now_ms()) / 1000) + p["timeout"]
            complete = wait_records(ctx.r, dues, deadline, check=w.check)
        ctx.check_crash(which, kind, w)
        res = analyze(dues, read_records(ctx.r))
        res.update({"offer_seconds": round(offer_s, 3), "offer_rate": round(p["n"] / offer_s), "complete": complete})
        ctx.check_delivery(which, kind, res)
        data[kind] = res
        rows.append(_lat_row(kind, res, early=res["early"], **{"offered/s": res["offer_rate"]}))
        broker.close()
    _add_ratio_rows(rows, data)
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


# -- 2. head-of-line -------------------------------------------------------------------


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


# -- 3. backlog cost -------------------------------------------------------------------


def _fill_reference(ctx: Ctx, far: int, due: int) -> None:
    """Fill Redisson's structures directly: ``far`` entries due in 1 h offered first, then
    ``due`` entries already due. Members look like ours: 16-char key + a uuid-sized id."""
    from ._common import queue_keys

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
    from ._common import queue_keys

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


def _offer_due(
    ctx: Ctx, broker: Any, kind: str, actor: Any, seqs: list[int], delay: int, variant: str = "enqueue_many"
) -> tuple[dict[int, float], float]:
    """Offer ``seqs`` due in ``delay`` ms, all at once. Returns (seq -> due ms, seconds)."""
    t0 = time.monotonic()
    if variant == "same_ms":
        # One absolute due time for all: offer.lua's "abs" mode (the legacy-migration path).
        keys = broker.keys(QUEUE)
        due_abs = int(ctx.server.now_ms()) + delay
        messages = [actor.message(seq) for seq in seqs]
        t0 = time.monotonic()
        with broker.client.pipeline(transaction=False) as pipe:
            for start in range(0, len(messages), 500):
                entries = []
                for m in messages[start : start + 500]:
                    prepared, sort_key = broker.prepare_scheduled(m)
                    entries.append((due_abs, sort_key, prepared.message_id, prepared.encode(), ""))
                broker.redisson_scripts.offer(keys, entries, absolute=True, client=pipe)
            pipe.execute()
        dues = {seq: float(due_abs) for seq in seqs}
    elif kind == "builtin":
        # The dispatch.lua "enqueue" call RedisBroker.enqueue makes, pipelined, one eta.
        dues = bulk_offer(broker, kind, actor, seqs, delay, chunk=len(seqs), read_dues=True, server=ctx.server)
    else:
        dues = bulk_offer(broker, kind, actor, seqs, delay, chunk=len(seqs), read_dues=True, server=ctx.server)
    return dues, time.monotonic() - t0


def _move_measure(
    ctx: Ctx,
    broker: Any,
    kind: str,
    actor: Any,
    seqs: list[int],
    delay: int,
    timeout: float,
    variant: str = "enqueue_many",
) -> dict[str, Any]:
    """With mover workers running: offer ``seqs`` due at once, wait until all are in the
    ready list; server script time (EVALSHA commandstats), longest call (slowlog)."""
    names = script_names(broker)
    ready = f"dramatiq:{QUEUE}"
    base_len = ctx.r.llen(ready)
    n = len(seqs)
    ctx.server.slowlog_on()
    dues, offer_s = _offer_due(ctx, broker, kind, actor, seqs, delay, variant)
    offered_at = ctx.server.now_ms()
    min_due, max_due = min(dues.values()), max(dues.values())
    ctx.server.reset_stats()  # count the moving only, not the offers
    deadline = time.monotonic() + max(0.0, (max_due - ctx.server.now_ms()) / 1000) + timeout
    t_first = t_done = None
    while time.monotonic() < deadline:
        length = ctx.r.llen(ready) - base_len
        now = ctx.server.now_ms()
        if length and t_first is None:
            t_first = now
        if length >= n:
            t_done = now
            break
        time.sleep(0.005)
    moved = ctx.r.llen(ready) - base_len
    calls, usec = ctx.server.evalsha_stats()
    entries, overflow = ctx.server.slowlog()
    ctx.server.slowlog_off()
    groups = classify_slowlog(entries, names)
    longest = longest_call(groups)
    return {
        "n": n,
        "offer_seconds": round(offer_s, 3),
        "distinct_due_ms": len(set(dues.values())),
        "due_spread_ms": round(max_due - min_due, 1),
        "offer_overlapped_due": offered_at >= min_due,
        "moved": moved,
        "all_moved": t_done is not None,
        "move_all_after_last_due_ms": round(t_done - max_due, 1) if t_done else None,
        "move_all_after_first_due_ms": round(t_done - min_due, 1) if t_done else None,
        "first_moved_after_due_ms": round(t_first - min_due, 1) if t_first else None,
        "script_calls": calls,
        "script_ms_total": round(usec / 1000, 2),
        "script_us_per_moved": round(usec / moved, 3) if moved > 0 else None,
        "longest_call_ms": round(longest["max_us"] / 1000, 3),
        "longest_call_by": longest["by"],
        "long_calls": {
            k: {"over_1ms": v["over_1ms"], "over_5ms": v["over_5ms"], "max_us": v["max_us"]}
            for k, v in groups.items()
            if not k.startswith("(harness)") and v["over_1ms"]
        },
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
                    "dup": res["duplicated"],
                }
            )
            broker.close()
    targets = []
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
    return {"data": data, "rows": rows, "targets": targets}


# -- 4. memory -------------------------------------------------------------------------


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
                    "target": "server bytes per scheduled message <= 1.3 x built-in",
                    "value": f"{mine} vs {theirs} = {ratio}x",
                    "met": (ratio is not None and ratio <= 1.3) if ok else None,
                }
            )
    return {"data": data, "rows": rows, "targets": targets}


# -- 5. offer throughput -----------------------------------------------------------------


def offer_throughput(ctx: Ctx) -> dict[str, Any]:
    import multiprocessing as mp

    from ._child import offer_main

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
                res = out.get(timeout=600)
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
    import statistics

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


# -- 6. idle pickup ----------------------------------------------------------------------


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


# -- 7. burst ----------------------------------------------------------------------------


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


# -- 8. fleet: server cost per message vs number of worker processes ---------------------

FLEET_MODES = ("immediate", "delayed")


def _fleet_snapshot(ctx: Ctx, w: Workers) -> dict[str, Any]:
    """The end of a measured window: server CPU first (closest to the last record), then
    the command statistics and the workers' command counts."""
    return {
        "t": time.monotonic(),
        "cpu": ctx.server.cpu_seconds(),
        "stats": ctx.server.commandstats(),
        "workers": w.command_counts(),
    }


def _top_level_usec(stats: dict[str, tuple[int, int]], sent: dict[str, int]) -> dict[str, float]:
    """Server time of the commands clients sent, per command: Valkey counts a command a
    script runs under its own name too (and in the script's EVALSHA), so a command's
    usec is shared out by the fraction of its calls the clients sent themselves (counted
    client-side): EVALSHA counts whole, a command only scripts run counts nothing. The
    recorder's EVAL and the harness's own commands (not counted) are left out."""
    out: dict[str, float] = {}
    for name, (calls, usec) in stats.items():
        if name == "eval" or not calls:
            continue
        share = min(1.0, sent.get(name, 0) / calls)
        if share:
            out[name] = usec * share
    return out


def _fleet_window(
    ctx: Ctx, kind: str, mode: str, procs: int, w: Workers, broker: Any, actor: Any, slots: list[str]
) -> dict[str, Any]:
    """One measured window: idle workers, then ``rate`` messages/s for ``window`` s from one
    producer, then until the last record. Server CPU, command time and calls per message."""
    p = ctx.p["fleet"]
    n = int(round(p["rate"] * p["window"]))
    delayed = mode == "delayed"
    # Warm-up (scripts loaded, connections open), outside the window; then idle.
    if delayed:
        actor.send_with_options(args=(-1,), delay=50)
    else:
        actor.send(-1)
    if not wait_records(ctx.r, [-1], time.monotonic() + p["timeout"], grace_s=0, check=w.check):
        ctx.log(f"fleet/{kind}/{mode}/{procs} procs: the warm-up message did not run within {p['timeout']} s")
    ctx.r.delete(REC_KEY)
    idle0, t_idle = ctx.server.cpu_seconds(), time.monotonic()
    time.sleep(p["settle"])
    idle_cpu_ms_per_s = (ctx.server.cpu_seconds() - idle0) * 1000 / (time.monotonic() - t_idle)
    w.check()
    producer_out = [0] * len(slots)
    counter = CommandCounter(slots, script_names(broker), producer_out)
    workers0 = w.command_counts()
    ctx.server.reset_stats()  # CONFIG RESETSTAT: commandstats count from here
    cpu0 = ctx.server.cpu_seconds()
    dues: dict[int, float] = {}
    t0 = time.monotonic()
    counter.activate()
    try:
        for seq in range(n):
            time.sleep(max(0.0, t0 + seq / p["rate"] - time.monotonic()))
            if delayed:
                m = actor.send_with_options(args=(seq,), delay=p["delay"])
                dues[seq] = due_of(broker, kind, m)
            else:
                dues[seq] = time.time() * 1000  # same host: the server's TIME reads this clock
                actor.send(seq)
    finally:
        CommandCounter.deactivate()
    send_s = time.monotonic() - t0
    deadline = time.monotonic() + (p["delay"] / 1000 if delayed else 0) + p["timeout"]
    complete = False
    while True:
        if ctx.r.llen(REC_KEY) >= n:
            end = _fleet_snapshot(ctx, w)
            if set(dues) <= {seq for seq, _, _ in read_records(ctx.r)}:
                complete = True
                break
        if time.monotonic() > deadline:
            end = _fleet_snapshot(ctx, w)
            break
        w.check()
        time.sleep(0.01)
    time.sleep(0.5)  # late duplicates
    res = analyze(dues, read_records(ctx.r))
    if not delayed:
        res["early"] = 0  # "due" is the send time, taken just before send()
    stats: dict[str, tuple[int, int]] = end["stats"]
    sent = {k: end["workers"][k] - workers0[k] + producer_out[i] for i, k in enumerate(slots)}
    top = _top_level_usec(stats, sent)
    cpu_s = end["cpu"] - cpu0
    evalsha_calls = stats.get("evalsha", (0, 0))[0]

    def per(x: float) -> float:
        return round(x / n, 3)

    res.update(
        {
            "mode": mode,
            "procs": procs,
            "messages": n,
            "complete": complete,
            "send_rate": round(n / send_s, 1),
            "window_s": round(end["t"] - t0, 3),
            "server_cpu_us_per_msg": per(cpu_s * 1e6),
            "cmd_us_per_msg": per(sum(top.values())),
            "script_calls_per_msg": per(evalsha_calls),
            "fetch_per_msg": per(sent["script:fetch"]),
            "transfer_per_msg": per(sent["script:transfer"]),
            "ack_per_msg": per(sent["script:ack"]),
            "other_scripts_per_msg": per(sent["script:other"]),
            "commands_sent_per_msg": per(sum(v for k, v in sent.items() if not k.startswith("script:"))),
            "recorder_us_per_msg": per(stats.get("eval", (0, 0))[1]),
            "all_cmdstats_us_per_msg": per(sum(u for k, (_, u) in stats.items() if k != "eval")),
            "server_cpu_s": round(cpu_s, 4),
            "idle_server_cpu_ms_per_s": round(idle_cpu_ms_per_s, 2),
            "top_level_usec": {k: round(v) for k, v in sorted(top.items(), key=lambda kv: -kv[1])},
            "sent": {k: v for k, v in sent.items() if v},
        }
    )
    ctx.check_delivery(f"fleet/{mode}/{procs} procs", kind, res)
    return res


def fleet(ctx: Ctx) -> dict[str, Any]:
    """Server cost per message as the number of worker processes (one thread each) grows,
    for plain sends and for delayed ones, at a fixed message rate."""
    p = ctx.p["fleet"]
    data: dict[str, Any] = {"params": p}
    kinds = [k for k in ctx.brokers if k != "redisson-lrem"]  # same consumer as redisson but the transfer
    slots = counter_slots(ctx.server.command_names())
    for kind in kinds:
        data[kind] = {mode: {} for mode in FLEET_MODES}
        for procs in p["procs"]:
            ctx.server.flush()
            broker, actor = ctx.producer(kind)
            ctx.log(
                f"fleet/{kind}: {procs} worker processes x 1 thread; {', '.join(FLEET_MODES)}: "
                f"{p['rate']} msgs/s for {p['window']} s each"
            )
            with Workers(kind, ctx.server.url, procs, 1, count_slots=slots) as w:
                for mode in FLEET_MODES:
                    data[kind][mode][str(procs)] = _fleet_window(ctx, kind, mode, procs, w, broker, actor, slots)
            ctx.check_crash("fleet", kind, w)
            broker.close()
    lo, hi = min(p["procs"]), max(p["procs"])

    def cpu(kind: str, mode: str, procs: int) -> float | None:
        res = data.get(kind, {}).get(mode, {}).get(str(procs))
        return res["server_cpu_us_per_msg"] if res else None

    rows = []
    for mode in FLEET_MODES:
        for procs in p["procs"]:
            for kind in kinds:
                res = data[kind][mode].get(str(procs))
                if res is None:
                    continue
                lat = res["lateness_ms"]
                rows.append(
                    {
                        "mode": mode,
                        "procs": procs,
                        "broker": kind,
                        "msgs": f"{res['ran']}/{res['expected']}",
                        "lost": res["lost"],
                        "dup": res["duplicated"],
                        "early": res["early"],
                        "server CPU us/msg": res["server_cpu_us_per_msg"],
                        "cmd us/msg": res["cmd_us_per_msg"],
                        "scripts/msg": res["script_calls_per_msg"],
                        "fetch/msg": res["fetch_per_msg"],
                        "transfer/msg": res["transfer_per_msg"],
                        "p50 ms": lat["p50"],
                        "p99 ms": lat["p99"],
                        "max ms": lat["max"],
                        "idle CPU ms/s": res["idle_server_cpu_ms_per_s"],
                        "CPU vs builtin": _ratio(cpu(kind, mode, procs), cpu("builtin", mode, procs))
                        if kind != "builtin"
                        else None,
                        f"CPU vs {lo} procs": _ratio(cpu(kind, mode, procs), cpu(kind, mode, lo)),
                    }
                )
    targets = []
    if "redisson" in data:
        for mode in FLEET_MODES:
            ours_hi, ours_lo = cpu("redisson", mode, hi), cpu("redisson", mode, lo)
            if "builtin" in data:
                theirs = cpu("builtin", mode, hi)
                targets.append(
                    {
                        "target": f"fleet {mode}: server CPU per message <= built-in at {hi} procs",
                        "value": f"{_r(ours_hi)} vs {_r(theirs)} us",
                        "met": ours_hi is not None and theirs is not None and ours_hi <= theirs,
                    }
                )
            ratio = _ratio(ours_hi, ours_lo)
            targets.append(
                {
                    "target": f"fleet {mode}: server CPU per message at {hi} procs <= 1.3 x at {lo} procs",
                    "value": f"{_r(ratio, 2)}x ({_r(ours_hi)} vs {_r(ours_lo)} us)",
                    "met": ratio is not None and ratio <= 1.3,
                }
            )
        for mode in FLEET_MODES:
            p99s = {procs: data["redisson"][mode][str(procs)]["lateness_ms"]["p99"] for procs in p["procs"]}
            worst = max(p99s, key=lambda k: p99s[k] if p99s[k] is not None else float("inf"))
            targets.append(
                {
                    "target": f"fleet {mode}: lateness p99 <= 5 ms at every process count",
                    "value": f"max {_r(p99s[worst], 2)} ms ({worst} procs)",
                    "met": all(v is not None and v <= 5 for v in p99s.values()),
                }
            )
    return {"data": data, "rows": rows, "targets": targets}


# -- 9. operations: the operator's bulk operations over a full delayed queue --------------

#: Per size: messages scheduled (and dead letters), single-message calls per operation,
#: stats() calls. (Kept here rather than in _common.SIZES: only this scenario reads them.)
OPERATIONS_SIZES: dict[str, dict[str, int]] = {
    "tiny": {"n": 2_000, "single": 100, "stats": 10, "dashboard_n": 2_000, "renders": 5},
    "small": {"n": 20_000, "single": 300, "stats": 20, "dashboard_n": 100_000, "renders": 20},
    "full": {"n": 100_000, "single": 300, "stats": 20, "dashboard_n": 1_000_000, "renders": 50},
}
DASHBOARD_PAGE_MS = 50.0  # the dashboard issue's bound on rendering a page of 50, server-side
OP_ACTORS = ("bench_op_a", "bench_op_b")
OP_LONGEST_MS = 5.0  # the bound on any single server call


def _op_actors(broker: Any) -> tuple[Any, Any]:
    """Two actors on the bench queue (never run: no workers in this scenario)."""
    import dramatiq

    def noop(seq: int) -> None:
        pass

    decorate: Any = dramatiq.actor
    a, b = (decorate(noop, broker=broker, queue_name=QUEUE, actor_name=name, max_retries=0) for name in OP_ACTORS)
    return a, b


def _op_fill(ctx: Ctx, broker: Any, actors: tuple[Any, Any], n: int, chunk: int = 1000) -> list[Any]:
    """``n`` messages scheduled 1-2 h ahead with ``enqueue_many`` (one delay per chunk,
    growing with the chunk, so the due times spread over the hour and the offer order is
    the due order), actors alternating a, b, a, … Returns the messages as enqueued."""
    ctx.server.flush()
    out: list[Any] = []
    for start in range(0, n, chunk):
        part = [actors[i % 2].message(i) for i in range(start, min(n, start + chunk))]
        out += broker.enqueue_many(part, delay=HOUR_MS + HOUR_MS * start // n)
    return out


def _op_fill_dead(ctx: Ctx, keys: Any, actor: Any, n: int, chunk: int = 5000) -> None:
    """``n`` dead letters in the built-in layout: ``.XQ`` id -> time of death, oldest
    first; ``.XQ.msgs`` id -> the encoded message (with its redis_message_id)."""
    import uuid

    died = int(ctx.server.now_ms()) - n
    for start in range(0, n, chunk):
        zset: dict[str, int] = {}
        msgs: dict[str, bytes] = {}
        for i in range(start, min(n, start + chunk)):
            rid = str(uuid.uuid4())
            zset[rid] = died + i
            msgs[rid] = actor.message_with_options(args=(i,), redis_message_id=rid).encode()
        with ctx.r.pipeline(transaction=False) as pipe:
            pipe.zadd(keys.xq, zset)
            pipe.hset(keys.xq_msgs, mapping=msgs)
            pipe.execute()


def _op_actor_counts(ctx: Ctx, keys: Any, members: list[bytes]) -> dict[str, int]:
    """How many of ``members`` (scheduled entries) belong to each bench actor, from their
    stored payloads (a missing payload counts as "?")."""
    counts = dict.fromkeys((*OP_ACTORS, "?"), 0)
    for start in range(0, len(members), 5000):
        part = members[start : start + 5000]
        for data in ctx.r.hmget(keys.payloads, [m[16:] for m in part]):
            name = next((a for a in OP_ACTORS if data and f'"actor_name":"{a}"'.encode() in data), "?")
            counts[name] += 1
    return counts


def _op_measure(
    ctx: Ctx, names: dict[str, str], slots: list[str], fn: Callable[[], Any], slower_than_us: int
) -> tuple[Any, dict[str, Any]]:
    """Run ``fn`` once, measured: wall time; commands this process sent (redis-py's packer,
    pipelined or not: the server calls); their server time (INFO commandstats, commands
    run inside scripts not counted twice); the longest single call (SLOWLOG: an EVALSHA's
    entry is the whole script call)."""
    out = [0] * len(slots)
    counter = CommandCounter(slots, names, out)
    ctx.server.slowlog_on(slower_than_us=slower_than_us)
    counter.activate()
    t0 = time.perf_counter()
    try:
        result = fn()
    finally:
        wall = time.perf_counter() - t0
        CommandCounter.deactivate()
    stats = ctx.server.commandstats()
    entries, overflow = ctx.server.slowlog()
    ctx.server.slowlog_off()
    sent = {k: out[i] for i, k in enumerate(slots) if out[i] and not k.startswith("script:")}
    groups = classify_slowlog(entries, names)
    longest = longest_call(groups)
    per_script: dict[str, list[float]] = {}
    for duration, argv in entries:  # script calls only (each EVALSHA entry is one whole call)
        if argv and argv[0].upper() == b"EVALSHA" and len(argv) > 1:
            per_script.setdefault(names.get(argv[1].decode(), "?"), []).append(duration / 1000)
    pooled = [d for durations in per_script.values() for d in durations]
    return result, {
        "wall_s": wall,
        "calls": sum(sent.values()),
        "sent": sent,
        "server_us": sum(_top_level_usec(stats, sent).values()),
        "script_calls": stats.get("evalsha", (0, 0))[0],
        "longest_us": longest["max_us"],
        "longest_by": longest["by"],
        "by_script": {
            k: {"calls": int(v["count"]), "max_us": int(v["max_us"])}
            for k, v in groups.items()
            if not k.startswith("(harness)")
        },
        # Durations (ms) of the logged script calls, per script: with the 100 us threshold,
        # only the calls that took longer (in bulk operations, nearly all of them).
        "script_call_ms": {k: pct(v) for k, v in per_script.items()},
        "script_call_p50_ms": pct(pooled)["p50"],
        "slowlog_threshold_us": slower_than_us,
        "slowlog_overflow": overflow,
    }


def _timed_calls(fn: Callable[[Any], Any], items: list[Any]) -> tuple[list[Any], list[float]]:
    """``fn(item)`` for every item; the results and each call's client time (ms)."""
    results, times = [], []
    for item in items:
        t0 = time.perf_counter()
        results.append(fn(item))
        times.append((time.perf_counter() - t0) * 1000)
    return results, times


def operations(ctx: Ctx) -> dict[str, Any]:
    """The operator's operations (issue 8) over a full delayed queue: scan, promote_all,
    remove_all, dead letters' requeue_all and clear, stats, and get / reschedule / promote
    of one message: wall time, server calls, longest single server call, correctness."""
    from dramatiq_redisson._delayed_queue import BULK_STEP

    p = {**OPERATIONS_SIZES[ctx.size], "bulk_step": BULK_STEP}
    data: dict[str, Any] = {"params": p}
    rows: list[dict[str, Any]] = []
    for kind in ctx.brokers:
        if kind == "builtin":
            rows.append({"broker": kind, "operation": "(none: RedisBroker has no such operations)"})
        elif kind == "redisson-lrem":
            rows.append({"broker": kind, "operation": "(not run: the same operations as redisson)"})
    if "redisson" not in ctx.brokers:
        return {"data": data, "rows": rows, "targets": []}

    n, k = p["n"], p["single"]
    n_a, n_b = (n + 1) // 2, n // 2
    broker, _ = ctx.producer("redisson")
    actors = _op_actors(broker)
    keys = broker.keys(QUEUE)
    dq = broker.delayed_queue(QUEUE)
    dead = broker.dead_letters(QUEUE)
    names = script_names(broker)
    slots = counter_slots(ctx.server.command_names())
    for script in broker.redisson_scripts._s.values():
        ctx.r.script_load(script.script)  # no NOSCRIPT round trip inside a measurement
    data["redisson"] = ops = {}
    our_rows: list[dict[str, Any]] = []

    def check(op: str, what: str, got: Any, expected: Any) -> bool:
        if got != expected:
            ctx.fail(f"operations/redisson: {op}: {what} {got!r}, expected {expected!r}")
            return False
        return True

    def measure(
        op: str, fn: Callable[[], Any], slower_than_us: int = SLOWLOG_THRESHOLD_US
    ) -> tuple[Any, dict[str, Any]]:
        ctx.log(f"operations/redisson: {op}")
        return _op_measure(ctx, names, slots, fn, slower_than_us)

    def row(op: str, affected: int, m: dict[str, Any], ok: bool, lat: list[float] | None = None) -> None:
        per = affected or 1
        res = {
            **m,
            "affected": affected,
            "ok": ok,
            "wall_us_per_msg": m["wall_s"] * 1e6 / per,
            "server_us_per_msg": m["server_us"] / per,
        }
        if lat is not None:
            res["client_ms"] = pct(lat)
        ops[op] = res
        longest_ms = m["longest_us"] / 1000
        our_rows.append(
            {
                "broker": "redisson",
                "operation": op,
                "msgs": affected,
                "wall s": round(m["wall_s"], 3),
                "server calls": m["calls"],
                "server ms": round(m["server_us"] / 1000, 1),
                "longest call ms": round(longest_ms, 3),
                "longest by": m["longest_by"],
                "call p50 ms": m["script_call_p50_ms"],
                "wall us/msg": round(res["wall_us_per_msg"], 2),
                "server us/msg": round(res["server_us_per_msg"], 2),
                "client p50 ms": res["client_ms"]["p50"] if lat is not None else None,
                "client p99 ms": res["client_ms"]["p99"] if lat is not None else None,
                "checks": "ok" if ok else "MISMATCH",
                "longest <= 5 ms": "MET" if longest_ms <= OP_LONGEST_MS else "MISSED",
            }
        )

    # Fill 1: scans, then promote_all / remove_all of one actor's half.
    t0 = time.monotonic()
    _op_fill(ctx, broker, actors, n)
    data["fill_seconds"] = round(time.monotonic() - t0, 2)
    ctx.log(f"operations/redisson: {n} scheduled 1-2 h ahead in {data['fill_seconds']} s (enqueue_many)")
    check("fill", "scheduled", dq.size(), n)

    seen, m = measure("scan()", lambda: [(due, msg.message_id) for due, msg in dq.scan()])
    ok = check("scan()", "messages", len(seen), n)
    ok &= check("scan()", "distinct messages", len({mid for _, mid in seen}), n)
    ok &= check("scan()", "due order", all(a[0] <= b[0] for a, b in zip(seen, seen[1:], strict=False)), True)
    row("scan()", len(seen), m, ok)

    seen, m = measure("scan(actor_name=a)", lambda: [msg.actor_name for _, msg in dq.scan(actor_name=OP_ACTORS[0])])
    ok = check("scan(actor_name=a)", "messages", len(seen), n_a)
    ok &= check("scan(actor_name=a)", "other actors' messages", sum(a != OP_ACTORS[0] for a in seen), 0)
    row("scan(actor_name=a)", len(seen), m, ok)

    done, m = measure("promote_all(actor_name=a)", lambda: dq.promote_all(actor_name=OP_ACTORS[0]))
    now = int(ctx.server.now_ms())
    due_now = ctx.r.zrangebyscore(keys.timeout_zset, "-inf", now)
    ok = check("promote_all(actor_name=a)", "returned", done, n_a)
    ok &= check(
        "promote_all(actor_name=a)",
        "due now, by actor",
        _op_actor_counts(ctx, keys, due_now),
        {**dict.fromkeys(OP_ACTORS, 0), OP_ACTORS[0]: n_a, "?": 0},
    )
    row("promote_all(actor_name=a)", done, m, ok)

    done, m = measure("remove_all(actor_name=b)", lambda: dq.remove_all(actor_name=OP_ACTORS[1]))
    ok = check("remove_all(actor_name=b)", "returned", done, n_b)
    ok &= check("remove_all(actor_name=b)", "left scheduled", dq.size(), n_a)
    ok &= check("remove_all(actor_name=b)", "payloads left", ctx.r.hlen(keys.payloads), n_a)
    ok &= check("remove_all(actor_name=b)", "left not yet due", ctx.r.zcount(keys.timeout_zset, f"({now}", "+inf"), 0)
    row("remove_all(actor_name=b)", done, m, ok)

    # Fill 2: promote_all() of everything.
    _op_fill(ctx, broker, actors, n)
    done, m = measure("promote_all()", dq.promote_all)
    now = int(ctx.server.now_ms())
    ok = check("promote_all()", "returned", done, n)
    ok &= check("promote_all()", "scheduled", dq.size(), n)
    ok &= check("promote_all()", "not yet due", ctx.r.zcount(keys.timeout_zset, f"({now}", "+inf"), 0)
    row("promote_all()", done, m, ok)

    # Fill 3, with n dead letters: stats, one message's get / reschedule / promote,
    # remove_all(), then the dead letters' requeue_all and clear.
    filled = _op_fill(ctx, broker, actors, n)
    _op_fill_dead(ctx, keys, actors[0], n)

    def stats_calls() -> tuple[list[Any], list[float]]:
        return _timed_calls(lambda _: broker.stats(), list(range(p["stats"])))

    (replies, lat), m = measure("stats()", stats_calls, slower_than_us=0)
    got = {(r["queues"][QUEUE]["scheduled"], r["queues"][QUEUE]["dead"]) for r in replies}
    ok = check("stats()", "(scheduled, dead)", got, {(n, n)})
    row("stats()", len(replies), m, ok, lat)

    mid = filled[n // 2 - k // 2 : n // 2 - k // 2 + k]
    ids = [msg.message_id for msg in mid]
    (found, lat), m = measure("get(id)", lambda: _timed_calls(dq.get, ids), slower_than_us=0)
    ok = check(
        "get(id)", "found", sum(f is not None and f[1].message_id == i for f, i in zip(found, ids, strict=True)), k
    )
    row("get(id)", k, m, ok, lat)

    (moved, lat), m = measure(
        "reschedule(id, delay=90 min)",
        lambda: _timed_calls(lambda i: dq.reschedule(i, delay=HOUR_MS * 3 // 2), ids),
        slower_than_us=0,
    )
    ok = check("reschedule(id, delay=90 min)", "rescheduled", sum(moved), k)
    row("reschedule(id, delay=90 min)", k, m, ok, lat)

    (promoted, lat), m = measure("promote(id)", lambda: _timed_calls(dq.promote, ids), slower_than_us=0)
    now = int(ctx.server.now_ms())
    with ctx.r.pipeline(transaction=False) as pipe:
        for msg in mid:
            pipe.zscore(keys.timeout_zset, msg.options["redis_message_id"])
        scores = pipe.execute()
    ok = check("promote(id)", "promoted", sum(promoted), k)
    ok &= check("promote(id)", "due now", sum(s is not None and s <= now for s in scores), k)
    row("promote(id)", k, m, ok, lat)

    done, m = measure("remove_all()", dq.remove_all)
    ok = check("remove_all()", "returned", done, n)
    ok &= check("remove_all()", "left scheduled", dq.size(), 0)
    ok &= check("remove_all()", "payloads left", ctx.r.hlen(keys.payloads), 0)
    row("remove_all()", done, m, ok)

    done, m = measure("dead_letters.requeue_all()", dead.requeue_all)
    ok = check("dead_letters.requeue_all()", "returned", done, n)
    ok &= check("dead_letters.requeue_all()", "dead letters left", (dead.size(), ctx.r.hlen(keys.xq_msgs)), (0, 0))
    ok &= check("dead_letters.requeue_all()", "ready", (ctx.r.llen(keys.ready), ctx.r.hlen(keys.ready_msgs)), (n, n))
    row("dead_letters.requeue_all()", done, m, ok)

    ctx.r.delete(keys.ready, keys.ready_msgs)
    _op_fill_dead(ctx, keys, actors[0], n)
    done, m = measure("dead_letters.clear()", dead.clear)
    ok = check("dead_letters.clear()", "returned", done, n)
    ok &= check("dead_letters.clear()", "dead letters left", (dead.size(), ctx.r.hlen(keys.xq_msgs)), (0, 0))
    ok &= check("dead_letters.clear()", "ready", ctx.r.llen(keys.ready), 0)
    row("dead_letters.clear()", done, m, ok)

    dashboard_rows, dashboard_target = _dashboard_pages(ctx, broker, actors, p)
    data["dashboard"] = dashboard_rows
    broker.close()

    rows[:0] = our_rows + dashboard_rows
    worst = max(ops, key=lambda op: ops[op]["longest_us"])
    worst_ms = ops[worst]["longest_us"] / 1000
    targets = [
        {
            "target": f"operations: every operation's longest single server call <= 5 ms at {n} scheduled",
            "value": f"{_r(worst_ms, 3)} ms ({worst}, {ops[worst]['longest_by']})",
            "met": worst_ms <= OP_LONGEST_MS,
        },
        dashboard_target,
    ]
    return {"data": data, "rows": rows, "targets": targets}


def _dashboard_pages(
    ctx: Ctx, broker: Any, actors: tuple[Any, Any], p: dict[str, Any]
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The dashboard's pages over ``dashboard_n`` scheduled (and 1 000 dead letters): each
    rendered ``renders`` times by calling the WSGI app in this process (server-side time:
    the Redis calls, decoding and the template, without HTTP), checked for status 200 and
    the rows it must show."""
    import gc
    import io
    import wsgiref.util

    from dramatiq_redisson._delayed_queue import encode_cursor
    from dramatiq_redisson.dashboard import make_app

    n, renders = p["dashboard_n"], p["renders"]
    keys = broker.keys(QUEUE)
    t0 = time.monotonic()
    filled = _op_fill(ctx, broker, actors, n, chunk=5000)
    _op_fill_dead(ctx, keys, actors[0], 1000)
    ctx.log(f"operations/dashboard: {n} scheduled in {time.monotonic() - t0:.1f} s")
    app = make_app(broker)
    middle = ctx.r.zrange(keys.timeout_zset, n // 2, n // 2, withscores=True)[0]
    cursor = encode_cursor((str(int(middle[1])).encode(), middle[0]))
    message_id = filled[n // 2].message_id
    # The harness's own million messages would make every collection of the measured
    # process (the dashboard's server) walk them: a server holds none of them.
    del filled
    gc.collect()

    def render(path: str) -> tuple[float, str]:
        path, _, query = path.partition("?")
        environ: dict[str, Any] = {}
        wsgiref.util.setup_testing_defaults(environ)
        environ.update(REQUEST_METHOD="GET", PATH_INFO=path, QUERY_STRING=query, **{"wsgi.input": io.BytesIO()})
        status: list[str] = []
        started = time.perf_counter()
        body = b"".join(app(environ, lambda s, h: status.append(s)))
        elapsed = (time.perf_counter() - started) * 1000
        if status != ["200 OK"]:
            ctx.fail(f"operations/dashboard: GET {path}?{query} answered {status}")
        return elapsed, body.decode()

    pages = [
        ("overview", "/", 0),
        ("queue: first page of 50", f"/queues/{QUEUE}?n=50", 50),
        ("queue: a page of 50 in the middle", f"/queues/{QUEUE}?n=50&after={cursor}", 50),
        ("queue: search by actor, 50", f"/queues/{QUEUE}?n=50&actor={OP_ACTORS[1]}", 50),
        ("queue: text search, no match (budget)", f"/queues/{QUEUE}?n=50&q=no-such-text", 0),
        ("message detail", f"/queues/{QUEUE}/messages/{message_id}", 0),
        ("dead letters: page of 50", f"/queues/{QUEUE}/dead?n=50", 50),
    ]
    rows: list[dict[str, Any]] = []
    worst_page_ms = 0.0
    for name, path, expect_rows in pages:
        render(path)  # first render compiles the template
        times, body = [], ""
        for _ in range(renders):
            elapsed, body = render(path)
            times.append(elapsed)
        shown = body.count("<tr data-id=")
        ok = shown == expect_rows
        if not ok:
            ctx.fail(f"operations/dashboard: {name}: {shown} rows, expected {expect_rows}")
        stats = pct(times)
        if expect_rows == 50 and name.startswith("queue:"):
            worst_page_ms = max(worst_page_ms, float(stats["p99"] or 0))
        rows.append(
            {
                "broker": "redisson",
                "operation": f"dashboard: {name}",
                "msgs": n,
                "client p50 ms": stats["p50"],
                "client p99 ms": stats["p99"],
                "checks": "ok" if ok else "MISMATCH",
            }
        )
    ctx.server.flush()
    target = {
        "target": f"dashboard: a page of 50 scheduled renders in < {DASHBOARD_PAGE_MS:.0f} ms server-side "
        f"at {n} scheduled (p99)",
        "value": f"{worst_page_ms:.1f} ms",
        "met": worst_page_ms < DASHBOARD_PAGE_MS,
    }
    return rows, target


def lateness_paced(ctx: Ctx) -> dict[str, Any]:
    """Lateness with offers paced well below the workers' capacity: the delay machinery's
    own precision, without the queueing the full-speed scenario adds."""
    return lateness(ctx, "lateness_paced")


# -- 10. cluster: the broker on a 3-master Redis Cluster vs one server (issue 9) ------------

#: The queues of part (c) are this one and the next ``bench-failover-<i>`` on the same
#: master (the one killed); those of parts (a) and (b) are ``bench-0``, ``bench-1``, …
#: (their names decide their slots, and so their masters).
FAILOVER_QUEUE = "bench-failover"
#: Part (c)'s steady-state lateness counts the messages due this long (ms) before the kill.
STEADY_MARGIN_MS = 500
#: Each producer of part (c) (one per repeat and variant) numbers its messages from a multiple of this.
FAILOVER_SEQS = 10_000_000


@dataclass
class _Topology:
    """Where one half of the cluster scenario sends its messages."""

    label: str
    url: str
    #: Keyword arguments of ``RedissonBroker`` (``cluster=True`` on the cluster).
    options: dict[str, Any]
    #: Clients of the servers that hold the queues (the cluster's masters, as of now).
    masters: Callable[[], list[Any]]
    flush: Callable[[], None]
    #: Queue name -> the name of the server that owns its keys.
    master_of: Callable[[str], str]


def _cluster_topology(ctx: Ctx, cluster: Any) -> _Topology:
    from dramatiq_redisson import QueueKeys

    def flush() -> None:
        for master in cluster.masters:
            cluster.admin(master).execute_command("FLUSHALL", "SYNC")

    def master_of(queue: str) -> str:
        keys = QueueKeys(NAMESPACE, queue, cluster=True)
        return str(cluster.master_of_key(keys.ready).name)

    return _Topology(
        label=f"cluster ({len(cluster.masters)} masters x {cluster.replicas_per_master} replica)",
        url=cluster.url,
        options={"cluster": True},
        masters=lambda: [cluster.admin(m) for m in cluster.masters],
        flush=flush,
        master_of=master_of,
    )


def _single_topology(ctx: Ctx) -> _Topology:
    return _Topology(
        label="single server",
        url=ctx.server.url,
        options={},
        masters=lambda: [ctx.r],
        flush=ctx.server.flush,
        master_of=lambda queue: "single",
    )


def _spread(topo: _Topology, queues: list[str]) -> dict[str, list[str]]:
    """Master name -> the queues it owns."""
    out: dict[str, list[str]] = {}
    for queue in queues:
        out.setdefault(topo.master_of(queue), []).append(queue)
    return dict(sorted(out.items()))


def _ready_total(broker: Any, queues: list[str]) -> int:
    with broker.client.pipeline(transaction=False) as pipe:
        for queue in queues:
            pipe.llen(broker.keys(queue).ready)
        return sum(int(n) for n in pipe.execute())


def _worker_options(ctx: Ctx, topo_options: dict[str, Any], queues: list[str]) -> dict[str, Any]:
    """The workers' broker options and queues; records always go to the harness's server."""
    return {"broker": topo_options, "queues": queues, "record_url": ctx.server.url}


def _cluster_costs(ctx: Ctx, topo: _Topology, queues: list[str]) -> dict[str, Any]:
    """(a) Offer cost per message (one by one and ``enqueue_many``) and transfer cost per
    moved message: the client's wall time, and the scripts' server time (``EVALSHA`` in
    ``INFO commandstats``, summed over the masters)."""
    p = ctx.p["cluster"]
    topo.flush()
    broker = make_broker("redisson", topo.url, **topo.options)
    actors = {q: declare(broker, q, record=ctx.r) for q in queues}
    group = ServerGroup(topo.masters())
    out: dict[str, Any] = {}
    for q in queues:  # warm-up: scripts loaded on every server, connections open
        actors[q].send_with_options(args=(-1,), delay=HOUR_MS)

    def measured(what: str, n: int, fn: Callable[[], Any]) -> None:
        group.reset_stats()
        cpu0 = group.cpu_seconds()
        t0 = time.perf_counter()
        fn()
        wall = time.perf_counter() - t0
        cpu = group.cpu_seconds() - cpu0
        calls, usec = group.evalsha_stats()
        out[what] = {
            "n": n,
            "seconds": round(wall, 3),
            "client_us_per_msg": round(wall * 1e6 / n, 2),
            "script_us_per_msg": round(usec / n, 2),
            "script_calls": calls,
            "server_cpu_us_per_msg": round(cpu * 1e6 / n, 2),
        }

    n_one, n_bulk = p["offer_one"], p["offer_bulk"]
    ctx.log(f"cluster/costs/{topo.label}: {n_one} offers one by one over {len(queues)} queues")

    def one_by_one() -> None:
        for i in range(n_one):
            actors[queues[i % len(queues)]].send_with_options(args=(i,), delay=HOUR_MS)

    measured("offer", n_one, one_by_one)
    ctx.log(f"cluster/costs/{topo.label}: enqueue_many of {n_bulk} over {len(queues)} queues")
    batch = [actors[queues[i % len(queues)]].message(n_one + i) for i in range(n_bulk)]
    measured("enqueue_many", n_bulk, lambda: broker.enqueue_many(batch, delay=HOUR_MS))
    stored = sum(int(broker.client.zcard(broker.keys(q).timeout_zset)) for q in queues)
    out["stored"] = stored
    if stored != len(queues) + n_one + n_bulk:
        ctx.fail(f"cluster/costs/{topo.label}: {stored} scheduled after offering {len(queues) + n_one + n_bulk}")

    # Transfer: mover workers (prefetch 0: they only move due messages to the ready lists).
    topo.flush()
    n_move = p["move"]
    ctx.log(f"cluster/costs/{topo.label}: {n_move} due at once over {len(queues)} queues, moved by idle workers")
    options = _worker_options(ctx, topo.options, queues)
    with Workers("redisson", topo.url, ctx.p["procs"], ctx.p["threads"], mode="move", options=options) as w:
        time.sleep(p["settle"])
        batch = [actors[queues[i % len(queues)]].message(i) for i in range(n_move)]
        offered = broker.enqueue_many(batch, delay=p["move_delay"])
        offered_at = ctx.server.now_ms()
        group.reset_stats()  # count the moving only, not the offer
        cpu0 = group.cpu_seconds()
        dues = [float(m.options["eta"]) for m in offered]
        deadline = time.monotonic() + max(0.0, (max(dues) - offered_at) / 1000) + p["timeout"]
        t_done = None
        while time.monotonic() < deadline:
            if _ready_total(broker, queues) >= n_move:
                t_done = ctx.server.now_ms()
                break
            w.check()
            time.sleep(0.01)
        cpu = group.cpu_seconds() - cpu0
        calls, usec = group.evalsha_stats()
        moved = _ready_total(broker, queues)
    ctx.check_crash("cluster/costs", topo.label, w)
    if moved != n_move:
        ctx.fail(f"cluster/costs/{topo.label}: {moved} of {n_move} moved within the window")
    out["transfer"] = {
        "n": n_move,
        "moved": moved,
        "offer_overlapped_due": offered_at >= min(dues),
        "all_moved_after_first_due_ms": round(t_done - min(dues), 1) if t_done else None,
        "script_us_per_msg": round(usec / moved, 2) if moved else None,
        "script_calls": calls,
        "server_cpu_us_per_msg": round(cpu * 1e6 / moved, 2) if moved else None,
    }
    broker.close()
    return out


def _cluster_many(ctx: Ctx, topo: _Topology, queues: list[str]) -> dict[str, Any]:
    """(b) Worker processes consuming every queue: lateness of paced delayed messages
    spread over the queues, then the throughput of a burst due at once on every queue."""
    p = ctx.p["cluster"]
    topo.flush()
    ctx.r.delete(REC_KEY)
    spread = _spread(topo, queues)
    master = {q: name for name, qs in spread.items() for q in qs}
    broker = make_broker("redisson", topo.url, **topo.options)
    actors = {q: declare(broker, q, record=ctx.r) for q in queues}
    rng = random.Random(12)
    n, rate = p["paced_n"], p["rate"]
    options = _worker_options(ctx, topo.options, queues)
    ctx.log(
        f"cluster/many/{topo.label}: {len(queues)} queues ({', '.join(f'{k}: {len(v)}' for k, v in spread.items())}), "
        f"{n} delayed messages at {rate}/s, then {p['burst_per_queue']} per queue due at once"
    )
    with Workers("redisson", topo.url, ctx.p["procs"], ctx.p["threads"], options=options) as w:
        time.sleep(p["settle"])
        dues: dict[int, float] = {}
        queue_of: dict[int, str] = {}
        t0 = time.monotonic()
        for seq in range(n):
            time.sleep(max(0.0, t0 + seq / rate - time.monotonic()))
            queue = queues[seq % len(queues)]
            m = actors[queue].send_with_options(args=(seq,), delay=rng.randint(p["delay_lo"], p["delay_hi"]))
            dues[seq], queue_of[seq] = float(m.options["eta"]), queue
        deadline = time.monotonic() + max(0.0, (max(dues.values()) - ctx.server.now_ms()) / 1000) + p["timeout"]
        complete = wait_records(ctx.r, dues, deadline, check=w.check)
        paced = analyze(dues, read_records(ctx.r))
        paced["complete"] = complete
        by_master: dict[str, Any] = {}
        first: dict[int, float] = {}
        for seq, start, _ in read_records(ctx.r):
            first[seq] = min(start, first.get(seq, start))
        for name in spread:
            late = [first[s] - dues[s] for s in dues if master[queue_of[s]] == name and s in first]
            by_master[name] = pct(late)
        paced["by_master"] = by_master
        ctx.check_delivery("cluster/many/paced", "redisson", paced)

        # Burst: burst_per_queue messages on every queue, one enqueue_many, due at once.
        ctx.r.delete(REC_KEY)
        k = p["burst_per_queue"]
        batch = [actors[q].message(1_000_000 + i * len(queues) + j) for i in range(k) for j, q in enumerate(queues)]
        offered = broker.enqueue_many(batch, delay=p["burst_delay"])
        bdues = {int(m.args[0]): float(m.options["eta"]) for m in offered}
        deadline = time.monotonic() + p["burst_delay"] / 1000 + p["timeout"]
        complete = wait_records(ctx.r, bdues, deadline, check=w.check)
        burst_res = analyze(bdues, read_records(ctx.r))
        burst_res["complete"] = complete
        span = burst_res.get("first_due_to_last_start_ms")
        burst_res["throughput_per_s"] = round(burst_res["ran"] / (span / 1000)) if span else None
        ctx.check_delivery("cluster/many/burst", "redisson", burst_res)
    ctx.check_crash("cluster/many", topo.label, w)
    broker.close()
    return {"spread": spread, "paced": paced, "burst": burst_res}


@dataclass
class _Variant:
    """One side of a failover run: a ``wait_for_replicas`` setting, its own queue (on the
    same master as the other side's), producer broker and worker processes."""

    wait: int
    queue: str
    broker: Any
    actor: Any
    workers: Workers


def _failover_queues(cluster: Any, n: int) -> list[str]:
    """``n`` queue names whose slots the same master owns: ``bench-failover``, then the
    first ``bench-failover-<i>`` names that land there."""
    from dramatiq_redisson import QueueKeys

    def owner(queue: str) -> Any:
        return cluster.master_of_key(QueueKeys(NAMESPACE, queue, cluster=True).ready)

    names = [FAILOVER_QUEUE]
    master = owner(FAILOVER_QUEUE)
    i = 0
    while len(names) < n:
        i += 1
        if owner(f"{FAILOVER_QUEUE}-{i}") is master:
            names.append(f"{FAILOVER_QUEUE}-{i}")
    return names


def _produce(
    actor: Any, broker: Any, base: int, rng: random.Random, rate: float, lo: int, hi: int, stop: Any, sends: list[Any]
) -> None:
    """Send delayed messages at ``rate`` until ``stop``; log each send as (seq, start ms,
    end ms, delay, outcome, due or None, error class). Outcomes: "ok"; "unconfirmed"
    (``EnqueueNotReplicated``: on the master, too few replicas acknowledged it); "refused"
    (any other error: not written, or unknown)."""
    from dramatiq_redisson import EnqueueNotReplicated

    next_t = time.monotonic()
    seq = base
    while not stop.is_set():
        delay = rng.randint(lo, hi)
        began = time.time() * 1000
        due: float | None = None
        error = ""
        try:
            m = actor.send_with_options(args=(seq,), delay=delay)
            outcome, due = "ok", float(m.options["eta"])
        except EnqueueNotReplicated as e:
            dues = broker.bench_last_dues
            outcome, error = "unconfirmed", type(e).__name__
            due = float(dues[0]) if dues else None
        except Exception as e:  # the slot's master is gone, or the cluster is down
            outcome, error = "refused", type(e).__name__
        sends.append((seq, began, time.time() * 1000, delay, outcome, due, error))
        seq += 1
        next_t += 1 / rate
        now = time.monotonic()
        if next_t < now - 0.1:
            next_t = now  # after a blocked send: no burst to catch up
        else:
            time.sleep(max(0.0, next_t - now))


def _failover_analysis(
    ctx: Ctx, sends: list[Any], records: list[tuple[int, float, int]], kill_ms: float
) -> dict[str, Any]:
    """Lost, duplicated, early (from the records), and when delayed messages ran again."""
    ok = {s[0]: s for s in sends if s[4] == "ok"}
    unconfirmed = {s[0]: s for s in sends if s[4] == "unconfirmed"}
    refused = {s[0]: s for s in sends if s[4] == "refused"}
    dues = {seq: float(s[5]) for seq, s in ok.items()}
    res = analyze(dues, [r for r in records if r[0] in ok])
    first: dict[int, float] = {}
    runs: dict[int, int] = {}
    for seq, start, _ in records:
        runs[seq] = runs.get(seq, 0) + 1
        first[seq] = min(start, first.get(seq, start))
    # A send that raised may have written its message, or not; it must run at most once
    # and never early. A refused send's due time is at least its start + delay (the
    # offer reads the server's TIME after that).
    floor = {seq: float(s[5]) if s[5] is not None else s[1] + s[3] for seq, s in {**unconfirmed, **refused}.items()}
    res["duplicated"] += sum(runs[seq] - 1 for seq in floor if seq in runs)
    res["early"] += sum(1 for seq in floor if seq in first and first[seq] < floor[seq] - 1.0)
    res["unexpected"] = sum(1 for seq in runs if seq not in ok and seq not in floor)
    # Delayed messages flow again: the first run of a message due after the kill (it
    # could not have moved to the ready queue before the kill without running early).
    known = {**dues, **{seq: float(s[5]) for seq, s in unconfirmed.items() if s[5] is not None}}
    after = [first[seq] for seq, due in known.items() if due > kill_ms and seq in first]
    flow_ms = min(after) - kill_ms if after else None
    back = [s[2] for s in ok.values() if s[1] >= kill_ms]
    outage = [first[s] - dues[s] for s in dues if s in first and kill_ms < dues[s] <= kill_ms + (flow_ms or 0)]
    # Steady state: messages due well before the kill (one due just before it may still
    # have been on its way from the master when it died).
    before = [first[s] - dues[s] for s in dues if s in first and dues[s] <= kill_ms - STEADY_MARGIN_MS]
    refused_at = [s[1] for s in refused.values()]
    res.update(
        {
            "before_kill_lateness_ms": pct(before),
            "sends": len(sends),
            "accepted": len(ok),
            "unconfirmed": len(unconfirmed),
            "unconfirmed_ran": sum(1 for seq in unconfirmed if seq in runs),
            "refused": len(refused),
            "refused_ran": sum(1 for seq in refused if seq in runs),
            "refused_errors": sorted({s[6] for s in refused.values()}),
            "refused_span_s": round((max(refused_at) - min(refused_at)) / 1000, 3) if refused_at else 0.0,
            "sends_again_s": round((min(back) - kill_ms) / 1000, 3) if back else None,
            "flow_again_s": round(flow_ms / 1000, 3) if flow_ms is not None else None,
            "outage_due": len(outage),
            "outage_lateness_ms": pct(outage),
            "_sends": [[round(x, 1) if isinstance(x, float) else x for x in s] for s in sends],
        }
    )
    return res


def _failover_once(ctx: Ctx, cluster: Any, variants: list[_Variant], rep: int) -> dict[int, dict[str, Any]]:
    """(c) One failover: per variant a producer thread sends delayed messages at a steady
    rate to its queue; the master that owns the queues gets SIGKILL; its replica takes
    over; the killed node is started again (it rejoins as the new master's replica);
    sending goes on a while. Every send is logged with its outcome, every run recorded
    on the harness's server."""
    import threading

    p = ctx.p["cluster"]
    stop = threading.Event()
    sends: dict[int, list[Any]] = {v.wait: [] for v in variants}
    base = {v.wait: (rep * len(variants) + i + 1) * FAILOVER_SEQS for i, v in enumerate(variants)}
    threads = [
        threading.Thread(
            target=_produce,
            args=(
                v.actor,
                v.broker,
                base[v.wait],
                random.Random(rep * 10 + v.wait),
                p["failover_rate"],
                p["failover_delay_lo"],
                p["failover_delay_hi"],
                stop,
                sends[v.wait],
            ),
            name=f"failover-producer-{v.wait}",
            daemon=True,
        )
        for v in variants
    ]
    victim = cluster.master_of_key(variants[0].broker.keys(variants[0].queue).ready)
    for thread in threads:
        thread.start()
    try:
        time.sleep(p["warm"])
        for v in variants:
            v.workers.check()
        kill_ms = time.time() * 1000
        cluster.kill(victim)
        promoted, promoted_s = cluster.wait_for_failover(victim, timeout=p["timeout"])
        cluster.restart(victim)  # back as a replica of the promoted node
        cluster.wait_healthy(p["timeout"])
        healed_s = time.time() - kill_ms / 1000
        time.sleep(p["after"])
    finally:
        stop.set()
        for thread in threads:
            thread.join(60)
    last_due = max([kill_ms, *(s[5] for ss in sends.values() for s in ss if s[5] is not None)])
    deadline = time.monotonic() + max(0.0, (last_due - ctx.server.now_ms()) / 1000) + p["timeout"]
    expected = [s[0] for ss in sends.values() for s in ss if s[4] == "ok"]
    wait_records(ctx.r, expected, deadline, grace_s=1.0, check=lambda: [v.workers.check() for v in variants])
    everything = read_records(ctx.r)
    out = {}
    for v in variants:
        records = [r for r in everything if base[v.wait] <= r[0] < base[v.wait] + FAILOVER_SEQS]
        res = _failover_analysis(ctx, sends[v.wait], records, kill_ms)
        res.update(
            {
                "kill_ms": round(kill_ms, 1),
                "repeat": rep,
                "wait_for_replicas": v.wait,
                "queue": v.queue,
                "victim": victim.name,
                "promoted": promoted.name,
                "promoted_s": round(promoted_s, 3),
                "healed_s": round(healed_s, 3),
            }
        )
        out[v.wait] = res
    return out


def _cluster_failover(ctx: Ctx, cluster: Any) -> dict[int, list[dict[str, Any]]]:
    """(c) ``failover_repeats`` failovers, one after the other, each of the master that
    owns two queues: one produced and consumed with ``wait_for_replicas=0``, one with
    ``wait_for_replicas=1``, side by side (the same kill for both). The same worker
    processes run through all the repeats."""
    from contextlib import ExitStack

    p = ctx.p["cluster"]
    ctx.r.delete(REC_KEY)
    waits = (0, 1)
    queues = _failover_queues(cluster, len(waits))
    out: dict[int, list[dict[str, Any]]] = {wait: [] for wait in waits}
    with ExitStack() as stack:
        variants = []
        for wait, queue in zip(waits, queues, strict=True):
            options = {"cluster": True, "wait_for_replicas": wait}
            broker = make_broker("redisson", cluster.url, **options)
            stack.callback(broker.close)
            workers = Workers(
                "redisson",
                cluster.url,
                ctx.p["procs"],
                ctx.p["threads"],
                options=_worker_options(ctx, options, [queue]),
            )
            variants.append(_Variant(wait, queue, broker, declare(broker, queue, record=ctx.r), workers))
        for v in variants:
            stack.enter_context(v.workers)
        for i, v in enumerate(variants):
            v.actor.send_with_options(args=(-1 - i,), delay=50)
        if not wait_records(ctx.r, [-1 - i for i in range(len(variants))], time.monotonic() + p["timeout"], grace_s=0):
            ctx.fail(f"cluster/failover: the warm-up messages did not run within {p['timeout']} s")
        for rep in range(p["failover_repeats"]):
            ctx.log(
                f"cluster/failover: repeat {rep + 1}/{p['failover_repeats']}: queues {', '.join(queues)} "
                f"(wait_for_replicas {', '.join(map(str, waits))}), {p['failover_rate']} delayed msgs/s each; "
                f"SIGKILL of their master after {p['warm']} s"
            )
            for wait, res in _failover_once(ctx, cluster, variants, rep).items():
                ctx.log(
                    f"cluster/failover: wait_for_replicas={wait}: {res['victim']} killed, {res['promoted']} "
                    f"promoted after {res['promoted_s']} s; sends work again after {res['sends_again_s']} s, "
                    f"delayed messages flow again after {res['flow_again_s']} s; accepted {res['accepted']}, "
                    f"lost {res['lost']}, dup {res['duplicated']}, early {res['early']}"
                )
                out[wait].append(res)
    for v in variants:
        ctx.check_crash(f"cluster/failover/wait_for_replicas={v.wait}", "redisson", v.workers)
    return out


def _median(values: list[float | None]) -> float | None:
    nums = [v for v in values if v is not None]
    return round(statistics.median(nums), 3) if nums else None


def cluster(ctx: Ctx) -> dict[str, Any]:
    """The same broker on one server and on a 3-master Redis Cluster (issue 9): (a) offer
    and transfer cost per message, (b) many queues spread over the masters, (c) recovery
    from a master's SIGKILL with workers running. Records stay on the harness's server."""
    try:
        from tests.topology import Cluster
    except ImportError as e:  # run from the checkout's root: tests/ is next to benchmarks/
        raise RuntimeError(f"the cluster scenario needs tests/topology.py (run from the checkout): {e}") from e

    p = ctx.p["cluster"]
    queues = [f"bench-{i}" for i in range(p["queues"])]
    data: dict[str, Any] = {"params": p}
    tables: dict[str, list[dict[str, Any]]] = {}
    notes = []
    if "builtin" in ctx.brokers:
        notes.append(
            {
                "broker": "builtin",
                "note": "not run: RedisBroker cannot run on a cluster (dramatiq#754: its "
                "scripts touch keys of several slots); the single-server RedissonBroker is the reference",
            }
        )
    if "redisson-lrem" in ctx.brokers:
        notes.append({"broker": "redisson-lrem", "note": "not run: the reference transfer is single-server only"})
    if "redisson" not in ctx.brokers:
        return {"data": data, "rows": notes, "targets": []}
    t0 = time.monotonic()
    with Cluster(masters=3, replicas=1, node_timeout_ms=2000) as c:
        data["cluster_start_s"] = round(time.monotonic() - t0, 2)
        ctx.log(f"cluster: 3 masters x 1 replica up in {data['cluster_start_s']} s (node timeout 2000 ms)")
        topos = [_single_topology(ctx), _cluster_topology(ctx, c)]
        # Costs: cost_repeat rounds, single and cluster interleaved; the median of each number.
        cost_runs: dict[str, list[dict[str, Any]]] = {t.label: [] for t in topos}
        for _ in range(p["cost_repeat"]):
            for t in topos:
                cost_runs[t.label].append(_cluster_costs(ctx, t, queues))
        costs = {label: median_merge(runs) for label, runs in cost_runs.items()}
        many = {t.label: _cluster_many(ctx, t, queues) for t in topos}
        failover = _cluster_failover(ctx, c)
    data.update(
        {"costs": costs, "cost_runs": cost_runs, "many": many, "failover": {str(k): v for k, v in failover.items()}}
    )
    single, clustered = (t.label for t in topos)

    rows_a = []
    for what, label in (("offer", "offer (one by one)"), ("enqueue_many", "enqueue_many"), ("transfer", "transfer")):
        for topo in (single, clustered):
            res = costs[topo][what]
            ref = costs[single][what]
            rows_a.append(
                {
                    "operation": label,
                    "topology": topo,
                    "msgs": res["n"] if what != "transfer" else f"{res['moved']}/{res['n']}",
                    "client us/msg": res.get("client_us_per_msg"),
                    "script us/msg": res["script_us_per_msg"],
                    "script calls": res["script_calls"],
                    "masters CPU us/msg": res["server_cpu_us_per_msg"],
                    "client vs single": _ratio(res.get("client_us_per_msg"), ref.get("client_us_per_msg"))
                    if topo != single
                    else None,
                    "script vs single": _ratio(res["script_us_per_msg"], ref["script_us_per_msg"])
                    if topo != single
                    else None,
                }
            )
    tables["(a) cost per message: single server vs cluster"] = rows_a

    rows_b = []
    for topo in (single, clustered):
        res = many[topo]
        paced, burst_res = res["paced"], res["burst"]
        lat = paced["lateness_ms"]
        ref = many[single]
        rows_b.append(
            {
                "topology": topo,
                "queues per master": ", ".join(f"{k}: {len(v)}" for k, v in res["spread"].items()),
                "ran": f"{paced['ran'] + burst_res['ran']}/{paced['expected'] + burst_res['expected']}",
                "lost": paced["lost"] + burst_res["lost"],
                "dup": paced["duplicated"] + burst_res["duplicated"],
                "early": paced["early"] + burst_res["early"],
                "p50 ms": lat["p50"],
                "p99 ms": lat["p99"],
                "max ms": lat["max"],
                "p99 by master ms": " / ".join(str(v["p99"]) for v in paced["by_master"].values()),
                "burst msgs/s": burst_res["throughput_per_s"],
                "burst p99 ms": burst_res["lateness_ms"]["p99"],
                "p99 vs single": _ratio(lat["p99"], ref["paced"]["lateness_ms"]["p99"]) if topo != single else None,
                "msgs/s vs single": _ratio(burst_res["throughput_per_s"], ref["burst"]["throughput_per_s"])
                if topo != single
                else None,
            }
        )
    tables["(b) many queues over the masters: paced lateness, burst throughput"] = rows_b

    rows_c = []
    for wait, reps in failover.items():
        flows = [r["flow_again_s"] for r in reps]
        known = [f for f in flows if f is not None]
        rows_c.append(
            {
                "wait_for_replicas": wait,
                "repeats": len(reps),
                "promoted s p50": _median([r["promoted_s"] for r in reps]),
                "sends again s p50": _median([r["sends_again_s"] for r in reps]),
                "flow again s p50": _median(flows),
                "flow again s max": max(known) if known else None,
                "flow again s (each)": " / ".join(f"{f:.2f}" if f is not None else "-" for f in flows),
                "healed s p50": _median([r["healed_s"] for r in reps]),
                "accepted": sum(r["accepted"] for r in reps),
                "refused (ran)": f"{sum(r['refused'] for r in reps)} ({sum(r['refused_ran'] for r in reps)})",
                "unconfirmed (ran)": f"{sum(r['unconfirmed'] for r in reps)} "
                f"({sum(r['unconfirmed_ran'] for r in reps)})",
                "lost": sum(r["lost"] for r in reps),
                "dup": sum(r["duplicated"] for r in reps),
                "early": sum(r["early"] for r in reps),
                "steady p50 / p99 ms": " / ".join(
                    str(_median([r["before_kill_lateness_ms"][q] for r in reps])) for q in ("p50", "p99")
                ),
                "due in outage": sum(r["outage_due"] for r in reps),
                "outage late max ms": max((r["outage_lateness_ms"]["max"] or 0 for r in reps), default=None),
            }
        )
        for r in reps:
            name = f"cluster/failover/wait_for_replicas={wait}/repeat {r['repeat'] + 1}"
            if r["unexpected"]:
                ctx.fail(f"{name}: {r['unexpected']} messages that were never sent ran")
            if r["duplicated"]:
                ctx.fail(f"{name}: {r['duplicated']} duplicated messages")
            if r["early"]:
                ctx.fail(f"{name}: {r['early']} messages started before their due time")
            if r["lost"] and wait:
                ctx.fail(f"{name}: {r['lost']} accepted messages lost")
            elif r["lost"]:
                ctx.log(f"{name}: {r['lost']} accepted messages lost (asynchronous replication; reported, not failed)")
            if r["flow_again_s"] is None:
                ctx.fail(f"{name}: no delayed message due after the kill ran")
    tables["(c) failover: SIGKILL of the queue's master, workers running"] = rows_c
    rows = [{"part": title, **row} for title, part in tables.items() for row in part] + notes
    if notes:
        tables["not run"] = notes

    ratio = {
        what: _ratio(costs[clustered][what]["script_us_per_msg"], costs[single][what]["script_us_per_msg"])
        for what in ("offer", "enqueue_many", "transfer")
    }
    client_ratio = _ratio(costs[clustered]["offer"]["client_us_per_msg"], costs[single]["offer"]["client_us_per_msg"])
    targets = [
        {
            "target": "(cluster vs single: script time per message, offer / enqueue_many / transfer)",
            "value": " / ".join(f"{v}x" for v in ratio.values()),
            "met": None,
        },
        {
            "target": "(cluster vs single: client time per offer, one by one)",
            "value": f"{client_ratio}x",
            "met": None,
        },
    ]
    for row in rows_c:
        targets.append(
            {
                "target": f"failover (wait_for_replicas={row['wait_for_replicas']}): kill -> delayed messages flow "
                "again, p50 / max",
                "value": f"{row['flow again s p50']} / {row['flow again s max']} s",
                "met": None,
            }
        )
    one = next(r for r in rows_c if r["wait_for_replicas"] == 1)
    targets.append(
        {
            "target": "failover with wait_for_replicas=1: no accepted message lost, none twice, none early",
            "value": f"lost {one['lost']}, dup {one['dup']}, early {one['early']}",
            "met": not (one["lost"] or one["dup"] or one["early"]),
        }
    )
    return {"data": data, "rows": rows, "tables": tables, "targets": targets}


SCENARIOS: dict[str, Callable[[Ctx], dict[str, Any]]] = {
    "lateness": lateness,
    "lateness-paced": lateness_paced,
    "head-of-line": head_of_line,
    "backlog": backlog_cost,
    "memory": memory,
    "offer": offer_throughput,
    "idle": idle_pickup,
    "burst": burst,
    "fleet": fleet,
    "operations": operations,
    "cluster": cluster,
}

#: Size of the whole scenario's messages, to print with the table.
__all__ = ["Ctx", "SCENARIOS", "pct"]
