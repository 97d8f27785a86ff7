"""``lateness`` and ``lateness-paced``: how late delayed messages run, side by side;
``immediate-paced``: the same for messages sent without a delay (what each costs the
server); ``script-profile``: lateness-paced's workload with each script's server time per
call."""

from __future__ import annotations

import contextlib
import random
import threading
import time
from typing import Any

from .._brokers import script_names
from .._measure import analyze, classify_slowlog, read_records, server_work, wait_records
from .._stages import analyze_stages
from .._stages import enabled as stages_enabled
from ._shared import Ctx, _add_ratio_rows, _lat_row, _ratio, send_paced


class _SlowlogPoller:
    """Every command the server runs, with its time, over a run: SLOWLOG at 0 µs, read and
    reset every :attr:`interval` s (so the log never overflows) from a thread of its own."""

    interval = 0.25

    def __init__(self, ctx: Ctx) -> None:
        self.ctx = ctx
        self.entries: list[tuple[int, list[bytes]]] = []
        self.overflowed = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="slowlog-poller", daemon=True)

    def __enter__(self) -> _SlowlogPoller:
        self.ctx.server.slowlog_on(max_len=1_000_000, slower_than_us=0)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._drain()
        self.ctx.server.slowlog_off()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._drain()

    def _drain(self) -> None:
        entries, overflowed = self.ctx.server.slowlog()
        self.ctx.server.r.slowlog_reset()
        self.entries.extend(entries)
        self.overflowed = self.overflowed or overflowed


def lateness(ctx: Ctx, which: str = "lateness", *, profile: bool = False, otel: bool = False) -> dict[str, Any]:
    """How late delayed messages run; with each broker's server CPU and server commands per
    message over the run (workers idle-polling included, the recorder's commands not).
    ``profile``: also each script's calls and server time (SLOWLOG, which slows every
    command down: CPU and lateness are then not comparable with an unprofiled run).
    ``otel``: the producer and the workers of RedissonBroker run the tracing middleware
    on OpenTelemetry's no-op API (``_brokers.add_tracing``)."""
    p = ctx.p[which]
    pace = p.get("rate")  # offers per second, or None: as fast as one producer goes
    immediate = bool(p.get("immediate"))  # send() without a delay: "due" is the send time
    data: dict[str, Any] = {"params": p}
    rows = []
    # Without a delay the transfer plays no part: redisson-lrem would repeat redisson.
    for kind in [k for k in ctx.brokers if not (immediate and k == "redisson-lrem")]:
        ctx.server.flush()
        traced = otel and kind != "builtin"
        broker, actor = ctx.producer(kind, otel=traced)
        rng = random.Random(20_000)
        dues: dict[int, float] = {}
        ctx.log(
            f"{which}/{kind}: {p['n']} messages, "
            + ("sent without a delay" if immediate else f"delays {p['delay_lo']}-{p['delay_hi']} ms")
            + (f", offered at {pace}/s" if pace else "")
        )
        with ctx.workers(kind, otel=traced) as w:
            ctx.server.reset_stats()
            poller = _SlowlogPoller(ctx) if profile else None
            with poller or contextlib.nullcontext():
                cpu0 = ctx.server.cpu_seconds()
                offer_s = send_paced(broker, kind, actor, p, rng, dues, pace)
                deadline = time.monotonic() + max(0.0, (max(dues.values()) - ctx.server.now_ms()) / 1000) + p["timeout"]
                complete = wait_records(ctx.r, dues, deadline, check=w.check)
                cpu_s = ctx.server.cpu_seconds() - cpu0
                per_message = server_work(ctx.server.commandstats(), p["n"])
        ctx.check_crash(which, kind, w)
        if poller is not None:
            data[f"{kind} scripts"] = _script_rows(kind, classify_slowlog(poller.entries, script_names(broker)), p["n"])
            data[f"{kind} scripts overflowed"] = poller.overflowed
        records = read_records(ctx.r)
        res = analyze(dues, records)
        if stages_enabled() and kind != "builtin":
            starts: dict[int, float] = {}
            for seq, start, _pid in records:
                starts[seq] = min(start, starts.get(seq, start))
            res["stages"] = analyze_stages(ctx.r, dues, starts)
            ctx.log(f"{which}/{kind} stages: {res['stages']}")
        if immediate:
            res["early"] = 0  # "due" is the send time, taken just before send()
        res.update({"offer_seconds": round(offer_s, 3), "offer_rate": round(p["n"] / offer_s), "complete": complete})
        res.update(per_message, server_cpu_us_per_msg=round(cpu_s * 1e6 / p["n"], 1))
        if otel:
            res["otel"] = bool(broker.bench_otel)
            ctx.log(f"{which}/{kind}: tracing middleware {'on (no-op API)' if broker.bench_otel else 'not available'}")
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
    if immediate and "redisson" in data:
        ours = data["redisson"]
        targets.append(
            {
                "target": "server commands per immediate message (send -> run -> ack) <= 8",
                "value": ours["commands_per_msg"],
                "met": ours["commands_per_msg"] <= 8,
            }
        )
        if "builtin" in data:
            theirs = data["builtin"]
            ratio = _ratio(ours["server_cpu_us_per_msg"], theirs["server_cpu_us_per_msg"])
            targets.append(
                {
                    "target": "server CPU per immediate message <= 0.75x built-in",
                    "value": f"{ours['server_cpu_us_per_msg']} vs {theirs['server_cpu_us_per_msg']} us ({ratio}x)",
                    "met": ratio is not None and ratio <= 0.75,
                }
            )
    return {"data": data, "rows": rows, "targets": targets}


def _script_rows(kind: str, groups: dict[str, dict[str, float]], n: int) -> list[dict[str, Any]]:
    """Per script (and per command, inside scripts or not): calls per message, µs per call
    and per message, the longest call; the harness's own commands left out."""
    rows = []
    for name, g in sorted(groups.items(), key=lambda kv: -kv[1]["total_us"]):
        if name.startswith("(harness)") or name in ("recorder", "SLOWLOG"):
            continue
        calls = int(g["count"])
        rows.append(
            {
                "broker": kind,
                "script or command": name,
                "calls/msg": round(calls / n, 3),
                "us/call": round(g["total_us"] / calls, 1) if calls else None,
                "us/msg": round(g["total_us"] / n, 1),
                "max us": g["max_us"],
            }
        )
    return rows[:20]


def script_profile(ctx: Ctx) -> dict[str, Any]:
    """lateness-paced's and immediate-paced's workloads with every command's server time
    logged: what each script call costs in that regime (one call at a time, 200/s: every
    call starts cold), and the commands inside it. For where server time goes, not for CPU
    or lateness figures."""
    data: dict[str, Any] = {}
    rows = []
    for which, workload in (("lateness_paced", "delayed"), ("immediate_paced", "immediate")):
        result = lateness(ctx, which, profile=True)
        data[workload] = result["data"]
        for kind in ctx.brokers:
            rows += [{"workload": workload, **row} for row in result["data"].get(f"{kind} scripts", [])]
    return {"data": data, "rows": rows, "targets": []}


def immediate_paced(ctx: Ctx) -> dict[str, Any]:
    """lateness-paced's pace and workers with messages sent without a delay (``send()``):
    what an immediate message costs the server (commands and CPU per message, the
    built-in side by side) and how soon it runs."""
    return lateness(ctx, "immediate_paced")


def lateness_paced(ctx: Ctx) -> dict[str, Any]:
    """Lateness with offers paced well below the workers' capacity: the delay machinery's
    own precision, without the queueing the full-speed scenario adds."""
    return lateness(ctx, "lateness_paced")


def lateness_paced_otel(ctx: Ctx) -> dict[str, Any]:
    """lateness-paced with the tracing middleware (``dramatiq_redisson.tracing``) in the
    producer and the workers, on OpenTelemetry's API with no SDK: what an app pays for
    adding it. A product without the module runs without it, so ``python -m benchmarks.ab
    --ref <before it> lateness-paced-otel`` compares with and without."""
    return lateness(ctx, "lateness_paced", otel=True)


def immediate_paced_otel(ctx: Ctx) -> dict[str, Any]:
    """immediate-paced with the tracing middleware on the no-op API (see
    :func:`lateness_paced_otel`)."""
    return lateness(ctx, "immediate_paced", otel=True)
