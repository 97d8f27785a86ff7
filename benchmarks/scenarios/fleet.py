"""``fleet``: server cost by number of worker processes."""

from __future__ import annotations

import time
from typing import Any

from .._brokers import due_of, script_names
from .._measure import REC_KEY, CommandCounter, analyze, counter_slots, read_records, wait_records
from .._workers import Workers
from ._shared import Ctx, _r, _ratio, _top_level_usec

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
    evalsha_calls = stats.get("evalsha", (0, 0))[0] + stats.get("fcall", (0, 0))[0]  # script calls

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


def _idle_cpu_ms_per_s(ctx: Ctx, procs: int, seconds: float, broker_options: dict[str, Any]) -> float:
    """Server CPU (ms/s) of ``procs`` idle RedissonBroker worker processes over ``seconds``,
    after one message has run (scripts loaded, consumers subscribed, beats going)."""
    ctx.server.flush()
    broker, actor = ctx.producer("redisson")
    with Workers("redisson", ctx.server.url, procs, 1, options={"broker": broker_options}) as w:
        actor.send(-1)
        wait_records(ctx.r, [-1], time.monotonic() + 60, grace_s=0, check=w.check)
        time.sleep(2.0)  # every process has beaten, and the lease holder checked
        cpu0, t0 = ctx.server.cpu_seconds(), time.monotonic()
        time.sleep(seconds)
        cpu_ms_per_s = (ctx.server.cpu_seconds() - cpu0) * 1000 / (time.monotonic() - t0)
        w.check()
    broker.close()
    return cpu_ms_per_s


def _liveness_cost(ctx: Ctx, procs: int) -> dict[str, Any]:
    """The server CPU of liveness (beats, the lease holder's checks) at ``procs`` idle
    processes: idle server CPU with liveness on (the default) minus with it off
    (``liveness_timeout=0``), measured back to back, off first, over ``liveness_idle`` s."""
    seconds = ctx.p["fleet"].get("liveness_idle", 5.0)
    ctx.log(f"fleet/liveness: {procs} idle worker processes, liveness off then on, {seconds} s each")
    off = _idle_cpu_ms_per_s(ctx, procs, seconds, {"liveness_timeout": 0})
    on = _idle_cpu_ms_per_s(ctx, procs, seconds, {})
    return {"procs": procs, "idle_cpu_ms_per_s_off": round(off, 3), "idle_cpu_ms_per_s_on": round(on, 3)}


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
    if "redisson" in kinds:
        data["liveness"] = _liveness_cost(ctx, hi)

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
        live = data.get("liveness")
        busy = data["redisson"]["delayed"].get(str(hi))
        if live and busy:
            # The fleet's server CPU per second at its rate, against liveness's cost per second.
            fleet_ms_per_s = busy["server_cpu_us_per_msg"] * p["rate"] / 1000
            cost = live["idle_cpu_ms_per_s_on"] - live["idle_cpu_ms_per_s_off"]
            share = cost / fleet_ms_per_s if fleet_ms_per_s else None
            percent = _r(100 * share, 2) if share is not None else None
            targets.append(
                {
                    "target": f"liveness at {hi} procs: server CPU <= 2 % of the fleet's (delayed, {p['rate']}/s)",
                    "value": f"{_r(cost, 2)} ms/s (idle {_r(live['idle_cpu_ms_per_s_on'], 2)} on vs "
                    f"{_r(live['idle_cpu_ms_per_s_off'], 2)} off) = {percent} % "
                    f"of {_r(fleet_ms_per_s, 1)} ms/s",
                    "met": share is not None and share <= 0.02,
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
