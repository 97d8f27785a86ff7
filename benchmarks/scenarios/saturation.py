"""``saturation``: the highest delayed-message rate one server sustains, side by side.

Offers climb in stages (``rates``, messages per second, each for ``stage_s`` seconds; every
message delayed ``delay`` ms, offered in bulk every ``tick_ms``: ``enqueue_many`` for ours,
pipelined ``dispatch.lua`` for the built-in, one due time per tick). Per stage: lateness
(start − due), whether every message ran by the deadline, the server's CPU utilisation
while offers and runs overlap (``INFO cpu`` over wall time, after the first ``delay``), and
server CPU µs and commands per message over the stage (the recorder's EVAL, the same for
every broker, included). A stage is *sustained* when every message ran and lateness p99 is
at most ``p99_ms``. The climb stops after the first stage that is not.

On a 2-core machine the workers and the producer share the cores with the server, so the
server may not reach a core's worth before the clients do: the report gives its
utilisation at the top stage, to tell a server-bound limit from a client-bound one.

:func:`offer_stage` is also part (e) of the ``cluster`` scenario: one stage offered as
fast as the producer goes, its CPU counted per master of a cluster.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from .._brokers import bulk_offer
from .._measure import analyze, read_records, server_work, wait_records
from ._shared import Ctx, _ratio


def _offer_tick(broker: Any, kind: str, actor: Any, seqs: list[int], delay: int) -> dict[int, float]:
    """Offer ``seqs`` with one delay; their due times (server clock; the built-in's eta)."""
    if kind == "builtin":
        return bulk_offer(broker, kind, actor, seqs, delay, read_dues=True)
    messages = broker.enqueue_many([actor.message(seq) for seq in seqs], delay=delay)
    return {seq: float(m.options["eta"]) for seq, m in zip(seqs, messages, strict=True)}


def offer_stage(
    ctx: Ctx,
    broker: Any,
    kind: str,
    actor: Any,
    rate: int | None,
    first_seq: int,
    p: dict[str, Any],
    servers: Mapping[str, Any] | None = None,
    check: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """One stage: offer delayed messages (``p["delay"]`` ms) in bulk, wait until every one
    ran (records on the harness's server), and measure. ``rate`` messages/s for
    ``p["stage_s"]`` s, one call per ``p["tick_ms"]``; ``rate`` None: ``p["n"]`` messages
    as fast as the producer goes, ``p["chunk"]`` per call (one due time per call) without a
    pause. ``servers``: name -> the ``Server`` whose CPU (``INFO cpu``)
    and commands (``INFO commandstats``) count (default: the harness's server); each one's
    CPU µs per message is reported apart (``server_cpu_us_per_msg_by_server``). ``check``:
    called while waiting (the workers' crash check)."""
    servers = servers or {"server": ctx.server}
    n = int(rate * p["stage_s"]) if rate else int(p["n"])
    tick = p.get("tick_ms", 20) / 1000

    def cpu_now() -> float:
        return sum(s.cpu_seconds() for s in servers.values())

    dues: dict[int, float] = {}
    for server in servers.values():
        server.reset_stats()
    cpu0 = {name: s.cpu_seconds() for name, s in servers.items()}
    t0 = time.monotonic()
    steady: tuple[float, float] | None = None
    sent = 0
    lagging = 0
    while sent < n:
        now = time.monotonic()
        if steady is None and now - t0 >= p["delay"] / 1000:
            steady = (now, cpu_now())
        target = min(n, int((now - t0) * rate) + 1) if rate else min(n, sent + p["chunk"])
        if target > sent:
            seqs = list(range(first_seq + sent, first_seq + target))
            dues.update(_offer_tick(broker, kind, actor, seqs, p["delay"]))
            sent = target
        if not rate:
            continue  # as fast as possible
        pause = tick - (time.monotonic() - now)
        if pause > 0:
            time.sleep(pause)
        else:
            lagging += 1
    t_offered, cpu_offered = time.monotonic(), cpu_now()
    offer_rate = n / (t_offered - t0)
    deadline = t_offered + p["delay"] / 1000 + p["timeout"]
    complete = wait_records(ctx.r, dues, deadline, grace_s=0.2, check=check)
    wall = time.monotonic() - t0
    cpu = {name: s.cpu_seconds() - cpu0[name] for name, s in servers.items()}
    stats: dict[str, tuple[int, int]] = {}
    for server in servers.values():
        for name, (calls, usec) in server.commandstats().items():
            c, u = stats.get(name, (0, 0))
            stats[name] = (c + calls, u + usec)
    work = server_work(stats, n)
    res = analyze(dues, [r for r in read_records(ctx.r) if r[0] in dues])
    util = None
    if steady is not None and t_offered > steady[0]:
        util = round(100 * (cpu_offered - steady[1]) / (t_offered - steady[0]), 1)
    p99 = res["lateness_ms"]["p99"]
    span = res.get("first_due_to_last_start_ms")
    res.update(work)
    res.update(
        {
            "rate": rate,
            "offered_per_s": round(offer_rate),
            "complete": complete,
            # Messages run per second from the first due time to the last start.
            "throughput_per_s": round(res["ran"] / (span / 1000)) if span else None,
            "server_cpu_pct": util,
            "server_cpu_us_per_msg": round(sum(cpu.values()) * 1e6 / n, 1),
            "server_cpu_us_per_msg_by_server": {name: round(c * 1e6 / n, 1) for name, c in sorted(cpu.items())},
            # Each server's CPU over the stage's wall time (offers to the last run + 0.2 s).
            "server_cpu_pct_by_server": {name: round(100 * c / wall, 1) for name, c in sorted(cpu.items())},
            "producer_lagging_ticks": lagging,
            "sustained": bool(
                complete and not res["lost"] and p99 is not None and p99 <= p.get("p99_ms", float("inf"))
            ),
            "delivered": bool(complete and not res["lost"]),
        }
    )
    return res


def saturation(ctx: Ctx) -> dict[str, Any]:
    p = ctx.p["saturation"]
    data: dict[str, Any] = {"params": p}
    rows = []
    for kind in ctx.brokers:
        if kind == "redisson-lrem":
            continue  # the same offer and consumer as redisson: the transfer alone differs
        ctx.server.flush()
        broker, actor = ctx.producer(kind)
        stages: list[dict[str, Any]] = []
        with ctx.workers(kind) as w:
            time.sleep(0.5)
            seq = 0
            for rate in p["rates"]:
                ctx.log(f"saturation/{kind}: {rate}/s for {p['stage_s']} s, delay {p['delay']} ms")
                res = offer_stage(ctx, broker, kind, actor, rate, seq, p)
                seq += int(rate * p["stage_s"])
                w.check()
                ctx.check_delivery("saturation", kind, res, complete_required=False)
                stages.append(res)
                lat = res["lateness_ms"]
                rows.append(
                    {
                        "broker": kind,
                        "rate/s": rate,
                        "offered/s": res["offered_per_s"],
                        "ran": f"{res['ran']}/{res['expected']}",
                        "p50 ms": lat["p50"],
                        "p99 ms": lat["p99"],
                        "max ms": lat["max"],
                        "server CPU %": res["server_cpu_pct"],
                        "server us/msg": res["server_cpu_us_per_msg"],
                        "commands/msg": res["commands_per_msg"],
                        "sustained": "yes" if res["sustained"] else "no",
                    }
                )
                if not res["delivered"]:
                    break
        ctx.check_crash("saturation", kind, w)
        broker.close()
        sustained = [s for s in stages if s["sustained"]]
        delivered = [s for s in stages if s["delivered"]]
        data[kind] = {
            "stages": [_public(s) for s in stages],
            "max_sustained": sustained[-1]["rate"] if sustained else 0,
            "max_delivered": delivered[-1]["rate"] if delivered else 0,
            "at_max_sustained": {k: v for k, v in sustained[-1].items() if not k.startswith("_")}
            if sustained
            else None,
        }
    targets = []
    ours, theirs = data.get("redisson"), data.get("builtin")
    if ours:
        top = ours["at_max_sustained"] or {}
        targets.append(
            {
                "target": f"(max sustained delayed rate, all run, p99 <= {p['p99_ms']} ms: /s, server CPU %, us/msg)",
                "value": f"{ours['max_sustained']} / {top.get('server_cpu_pct')} / {top.get('server_cpu_us_per_msg')}",
                "met": None,
            }
        )
    if ours and theirs:
        base = theirs["max_sustained"] or None
        targets.append(
            {
                "target": "max sustained delayed rate >= 2 x built-in (built-in: its highest rate with all run "
                "and p99 within the bound; its max with all run, whatever the lateness, in brackets)",
                "value": f"{ours['max_sustained']} vs {theirs['max_sustained']} ({theirs['max_delivered']})",
                "met": bool(base and ours["max_sustained"] >= 2 * base) or (not base and ours["max_sustained"] > 0),
            }
        )
        targets.append(
            {
                "target": "(server us/msg at the built-in's highest fully delivered rate: ours / built-in)",
                "value": _at_rate(ours, theirs),
                "met": None,
            }
        )
    return {"data": data, "rows": rows, "targets": targets}


def _public(stage: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in stage.items() if not k.startswith("_")}


def _at_rate(ours: dict[str, Any], theirs: dict[str, Any]) -> str:
    rate = theirs["max_delivered"]
    a = next((s for s in ours["stages"] if s["rate"] == rate), None)
    b = next((s for s in theirs["stages"] if s["rate"] == rate), None)
    if not a or not b:
        return "-"
    ratio = _ratio(a["server_cpu_us_per_msg"], b["server_cpu_us_per_msg"])
    return f"{rate}/s: {a['server_cpu_us_per_msg']} / {b['server_cpu_us_per_msg']} = {ratio}x"
