"""``work-io``, ``work-cpu``, ``work-io-immediate``, ``work-io-90``, ``work-cpu-90``: actors
that take time (issue 46). Where do messages run in a fleet of worker processes, and how
late, when each run keeps a worker thread busy?

Each scenario paces ``n`` messages at ``rate``/s from one producer (delayed uniformly by
``delay_lo``–``delay_hi`` ms, or sent without a delay) to ``procs`` worker processes of
``threads`` threads whose actor records its start (server ``TIME`` and its pid, as every
scenario's) and then sleeps ``work_ms`` ("sleep": I/O-like, the GIL released) or burns
``work_ms`` of its thread's CPU time ("cpu": a pure-Python loop holding the GIL, so a
process runs one such job at a time; see ``_actor.work_body``). Every broker of the run
but ``redisson-lrem`` (its transfer is not what is measured here) gets the same seeded
delays, one after the other, on an emptied database.

Per broker: lateness (start − due) p50/p90/p99/max from the records; its growth (the p99
of the last third of the messages, by due time, minus that of the first third); messages
started per second over the span from the first due time to the last start, beside the
rate the producer offered them at and the rate they came due at (first to last due); each
worker process's share of the runs (by the pid in its records, largest first) and the
busiest one's; the server's CPU and commands per message over the run.

Beside them, the *perfect-placement limit*: a FIFO queue fed the run's own due times
(sorted; the first broker's), served by ``c`` servers, each run lasting exactly
``work_ms`` and starting at ``max(due, the earliest free server)``: its wait p50/p99/max,
the fraction of messages that wait at all, and its throughput. ``c`` is ``procs ×
threads`` for "sleep", ``min(procs, cores)`` for "cpu" (a process's threads share one
GIL). No placement of messages on threads does better with that work; what a broker adds
above it is its delivery's lateness and where it put the messages."""

from __future__ import annotations

import heapq
import os
import random
import time
from collections.abc import Sequence
from typing import Any

from .._measure import analyze, pct, read_records, server_work, wait_records
from .._workers import Workers
from ._shared import Ctx, _add_ratio_rows, _lat_row, send_paced

#: The label of the simulated row.
LIMIT = "limit (perfect placement)"

#: Per scenario (its ``SIZES`` key): the targets for RedissonBroker, reported MET/MISSED,
#: never failing the run. "share": the busiest process's share of the runs, in % (only
#: meaningful below saturation); "p50"/"p99": lateness, ms; "keeps_up": started/s at
#: least this fraction of the rate the messages came due at.
TARGETS: dict[str, dict[str, float]] = {
    "work_io": {"share": 65, "p99": 25},
    "work_cpu": {"share": 65, "p99": 20},
    "work_io_immediate": {"p50": 3, "p99": 8},
    "work_io_90": {"p99": 60, "keeps_up": 0.95},
    "work_cpu_90": {"keeps_up": 0.95},
}


def limit_servers(p: dict[str, Any]) -> int:
    """The servers of the perfect-placement queue: every thread for "sleep"; for "cpu", one
    per process (one GIL each), no more than the machine's cores."""
    if p["kind"] == "cpu":
        return max(1, min(int(p["procs"]), os.cpu_count() or 1))
    return int(p["procs"]) * int(p["threads"])


def perfect_placement(dues: Sequence[float], servers: int, service_ms: float) -> dict[str, Any]:
    """The FIFO queue with ``servers`` servers and a deterministic service time of
    ``service_ms``, fed ``dues`` (epoch ms) in order: each message starts at
    ``max(due, earliest free server)``. Its wait (start − due) percentiles, the fraction
    that waits at all, the growth of its p99 (last third − first third, by due) and its
    throughput (messages per second from the first due time to the last start)."""
    ordered = sorted(dues)
    free = [float("-inf")] * servers
    waits = []
    last_start = float("-inf")
    for due in ordered:
        start = max(due, heapq.heappop(free))
        heapq.heappush(free, start + service_ms)
        waits.append(start - due)
        last_start = max(last_start, start)
    out: dict[str, Any] = {
        "servers": servers,
        "service_ms": service_ms,
        "wait_ms": pct(waits),
        "waits_share": round(sum(1 for w in waits if w > 1e-6) / len(waits), 4) if waits else None,
        "growth_p99_ms": _growth(waits),
        "throughput": _per_s(len(ordered), last_start - ordered[0]) if ordered else None,
    }
    out["_lateness_samples"] = [round(w, 3) for w in waits]
    return out


def _growth(in_due_order: Sequence[float]) -> float | None:
    """p99 of the last third minus p99 of the first third (values in due order)."""
    third = len(in_due_order) // 3
    if third == 0:
        return None
    first, last = pct(in_due_order[:third])["p99"], pct(in_due_order[-third:])["p99"]
    return round(last - first, 3) if first is not None and last is not None else None


def _per_s(n: int, span_ms: float) -> float | None:
    return round(n * 1000 / span_ms, 1) if span_ms > 0 else None


def placement(dues: dict[int, float], records: list[tuple[int, float, int]], pids: Sequence[int]) -> dict[str, Any]:
    """From the records (each message's first run): the share of the runs per worker
    process (every process of ``pids`` counted, one that ran nothing as 0 %), largest
    first; the busiest share; lateness growth; started/s over first due → last start,
    and the rate the messages came due at over first → last due."""
    first: dict[int, tuple[float, int]] = {}
    for seq, start, pid in records:
        if seq in dues and (seq not in first or start < first[seq][0]):
            first[seq] = (start, pid)
    counts = dict.fromkeys(pids, 0)
    for _start, pid in first.values():
        counts[pid] = counts.get(pid, 0) + 1
    ran = len(first)
    shares = sorted((100 * c / ran for c in counts.values()), reverse=True) if ran else []
    in_due_order = [first[s][0] - dues[s] for s in sorted(first, key=lambda s: dues[s])]
    span_dues = max(dues.values()) - min(dues.values()) if dues else 0.0
    return {
        "shares_pct": [round(s, 1) for s in shares],
        "shares": " / ".join(f"{s:.0f} %" for s in shares) if shares else None,
        "busiest_share_pct": round(shares[0], 1) if shares else None,
        "growth_p99_ms": _growth(in_due_order),
        "throughput": _per_s(ran, max(s for s, _ in first.values()) - min(dues.values())) if first else None,
        "due_rate": _per_s(len(dues) - 1, span_dues),
    }


def work(ctx: Ctx, name: str) -> dict[str, Any]:
    """Run one ``work-*`` scenario (see the module): every broker but redisson-lrem, then
    the perfect-placement limit of the first broker's due times."""
    key = name.replace("-", "_")
    p = ctx.p[key]
    immediate = bool(p.get("immediate"))
    servers = limit_servers(p)
    data: dict[str, Any] = {"params": p, "cores": os.cpu_count()}
    rows: list[dict[str, Any]] = []
    options = {"work": {"kind": p["kind"], "ms": p["work_ms"]}}
    for kind in [k for k in ctx.brokers if k != "redisson-lrem"]:
        ctx.server.flush()
        broker, actor = ctx.producer(kind)  # declares bench_record without the work: only workers run it
        rng = random.Random(46_000)
        dues: dict[int, float] = {}
        ctx.log(
            f"{name}/{kind}: {p['n']} messages at {p['rate']}/s, "
            + ("sent without a delay" if immediate else f"delays {p['delay_lo']}-{p['delay_hi']} ms")
            + f", actor: {p['kind']} {p['work_ms']} ms, {p['procs']} x {p['threads']} workers"
        )
        with Workers(kind, ctx.server.url, p["procs"], p["threads"], options=options) as w:
            pids = w.pids
            ctx.server.reset_stats()
            cpu0 = ctx.server.cpu_seconds()
            offer_s = send_paced(broker, kind, actor, p, rng, dues, p["rate"])
            deadline = time.monotonic() + max(0.0, (max(dues.values()) - ctx.server.now_ms()) / 1000) + p["timeout"]
            complete = wait_records(ctx.r, dues, deadline, check=w.check)
            cpu_s = ctx.server.cpu_seconds() - cpu0
            per_message = server_work(ctx.server.commandstats(), p["n"])
        ctx.check_crash(name, kind, w)
        records = read_records(ctx.r)
        res = analyze(dues, records)
        if immediate:
            res["early"] = 0  # "due" is the send time, taken just before send()
        res.update(placement(dues, records, pids))
        res.update({"offer_seconds": round(offer_s, 3), "offer_rate": round(p["n"] / offer_s), "complete": complete})
        res.update(per_message, server_cpu_us_per_msg=round(cpu_s * 1e6 / p["n"], 1))
        limit = perfect_placement(list(dues.values()), servers, p["work_ms"])
        res["limit"] = {k: v for k, v in limit.items() if not k.startswith("_")}  # for its own due times
        if "limit" not in data:
            data["limit"] = {**limit, "dues_of": kind}
        ctx.check_delivery(name, kind, res)
        data[kind] = res
        rows.append(
            _lat_row(
                kind,
                res,
                early=res["early"],
                **{
                    "waits %": None,
                    "growth p99 ms": res["growth_p99_ms"],
                    "started/s": res["throughput"],
                    "due/s": res["due_rate"],
                    "offered/s": res["offer_rate"],
                    "shares": res["shares"],
                    "busiest %": res["busiest_share_pct"],
                    "server CPU us/msg": res["server_cpu_us_per_msg"],
                    "commands/msg": res["commands_per_msg"],
                },
            )
        )
        broker.close()
    _add_ratio_rows(rows, data)
    if "limit" in data:
        lim = data["limit"]
        wait = lim["wait_ms"]
        rows.append(
            {
                "broker": LIMIT,
                "ran": f"{wait['n']}/{wait['n']}",
                "p50 ms": wait["p50"],
                "p90 ms": wait["p90"],
                "p99 ms": wait["p99"],
                "max ms": wait["max"],
                "waits %": round(100 * lim["waits_share"], 1) if lim["waits_share"] is not None else None,
                "growth p99 ms": lim["growth_p99_ms"],
                "started/s": lim["throughput"],
                "shares": f"{servers} servers x {p['work_ms']} ms",
            }
        )
    return {"data": data, "rows": rows, "targets": _targets(name, key, data)}


def _targets(name: str, key: str, data: dict[str, Any]) -> list[dict[str, Any]]:
    """RedissonBroker's targets of this scenario (see :data:`TARGETS`)."""
    ours = data.get("redisson")
    if ours is None:
        return []
    want = TARGETS.get(key, {})
    lat = ours["lateness_ms"]
    out = [
        {
            "target": f"every message ran ({name})",
            "value": f"{ours['ran']}/{ours['expected']}",
            "met": bool(ours["complete"]) and not ours["lost"],
        }
    ]
    if "share" in want:
        share = ours["busiest_share_pct"]
        out.append(
            {
                "target": f"busiest process share <= {want['share']:g} % ({name})",
                "value": ours["shares"],
                "met": share is not None and share <= want["share"],
            }
        )
    for q in ("p50", "p99"):
        if q in want:
            out.append(
                {
                    "target": f"lateness {q} <= {want[q]:g} ms ({name})",
                    "value": lat[q],
                    "met": lat[q] is not None and lat[q] <= want[q],
                }
            )
    if "keeps_up" in want:
        started, due = ours["throughput"], ours["due_rate"]
        out.append(
            {
                "target": f"started/s >= {want['keeps_up']:g} x the rate messages came due ({name})",
                "value": f"{started} vs {due}/s (offered {ours['offer_rate']}/s)",
                "met": started is not None and due is not None and started >= want["keeps_up"] * due,
            }
        )
    return out


def work_io(ctx: Ctx) -> dict[str, Any]:
    """Actors sleeping 50 ms, delayed 1–3 s, offered at half the threads' capacity."""
    return work(ctx, "work-io")


def work_cpu(ctx: Ctx) -> dict[str, Any]:
    """Actors burning 10 ms of CPU (holding the GIL), delayed 1–3 s."""
    return work(ctx, "work-cpu")


def work_io_immediate(ctx: Ctx) -> dict[str, Any]:
    """work-io's actors and pace with ``send()`` without a delay: the due time is the send."""
    return work(ctx, "work-io-immediate")


def work_io_90(ctx: Ctx) -> dict[str, Any]:
    """work-io at about 90 % of the threads' capacity: does lateness grow over the run?"""
    return work(ctx, "work-io-90")


def work_cpu_90(ctx: Ctx) -> dict[str, Any]:
    """work-cpu at a higher rate: how close to the processes' capacity it keeps up."""
    return work(ctx, "work-cpu-90")
