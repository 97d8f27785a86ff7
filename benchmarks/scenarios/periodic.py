"""``periodic`` (issue 22): periodic actors' ticks, on time and exactly once, and what a
tick costs the server next to a plain delayed message, on the same worker processes.

N schedules on one actor (``bench_tick``, ``_actor.declare_periodic``), ``every`` spread
evenly over 1–10 s (whole ms), declared in every worker process: the workers store them
when their consumer starts. Once every schedule is stored and chained, and after a settle
period, a window of ``window`` s with nothing else running: server CPU (``INFO cpu``) and
commands (``INFO commandstats`` through ``server_work``) over the window, per tick due in
it. The expected ticks are computed here from each stored definition (``anchor + k ×
every``, in the window), not by the product. Every tick run records its schedule (the
message's ``periodic`` option), its tick time (``message_timestamp``) and its start on the
server's clock (the recorder's TIME, as for every message of the harness).

Then the schedules are removed (schedule.lua ``remove``, one call per schedule: the
operator's ``Schedules.remove`` looks the schedule up among all of them first) and the
same worker processes run a plain delayed message stream at the tick rate measured, as
lateness-paced does (``send_with_options`` one by one, delays uniform over
lateness-paced's range), measured the same way: server CPU and commands per message, from
just before the first send until the last record is seen. The harness's own polling for
that record (LLEN, LRANGE) is counted by the harness and taken off the commands.

RedissonBroker only: Dramatiq's RedisBroker has no periodic actors, and redisson-lrem's
reference transfer does not chain ticks; their rows say n/a.
"""

from __future__ import annotations

import json
import random
import time
from typing import Any

from .._actor import TICK_KEY
from .._base import PRODUCT_KINDS, QUEUE
from .._brokers import due_of
from .._measure import REC_KEY, analyze, pct, read_records, server_work
from .._workers import Workers
from ._shared import Ctx, _r, _ratio

#: Per size: schedules, worker processes, the measured window (s), the settle period (s)
#: between the schedules being stored and the window.
SIZES: dict[str, dict[str, Any]] = {
    "tiny": {"schedules": 20, "procs": 2, "window": 6, "settle": 0.5},
    "small": {"schedules": 200, "procs": 4, "window": 20, "settle": 2.0},
    "full": {"schedules": 1_000, "procs": 4, "window": 60, "settle": 3.0},
}
COMMON: dict[str, Any] = {"every_lo": 1.0, "every_hi": 10.0, "timeout": 30, "start_timeout": 90}

NOT_APPLICABLE = {
    "builtin": "n/a: Dramatiq's RedisBroker has no periodic actors",
    "redisson-lrem": "n/a: its reference transfer does not chain ticks",
}


def _schedules(n: int, lo: float, hi: float) -> list[tuple[str, float]]:
    """``n`` (name, every seconds): ``s0`` … ``s<n-1>``, intervals evenly from ``lo`` to ``hi``."""
    if n == 1:
        return [("s0", lo)]
    return [(f"s{i}", round(lo + (hi - lo) * i / (n - 1), 3)) for i in range(n)]


def _read_ticks(r: Any) -> list[tuple[str, int, float, int]]:
    """(schedule, tick ms, start ms on the server clock, pid) of every tick run so far."""
    out = []
    for raw in r.lrange(TICK_KEY, 0, -1):
        name, tick, sec, usec, pid = raw.decode().split()
        out.append((name, int(tick), int(sec) * 1000 + int(usec) / 1000, int(pid)))
    return out


def _stored(r: Any, keys: Any) -> dict[str, tuple[int, int]]:
    """name -> (anchor ms, every ms) of every stored schedule."""
    out = {}
    for name, raw in r.hgetall(keys.schedules).items():
        definition = json.loads(raw)
        out[name.decode()] = (int(definition["anchor"]), int(definition["spec"]["every_ms"]))
    return out


def _expected(stored: dict[str, tuple[int, int]], after: int, until: int) -> set[tuple[str, int]]:
    """The ticks ``t`` with ``after < t <= until`` of every schedule: ``anchor + k × every``."""
    ticks = set()
    for name, (anchor, every) in stored.items():
        tick = anchor + ((after - anchor) // every + 1) * every
        while tick <= until:
            ticks.add((name, tick))
            tick += every
    return ticks


def _analyze_ticks(
    stored: dict[str, tuple[int, int]], expected: set[tuple[str, int]], records: list[tuple[str, int, float, int]]
) -> dict[str, Any]:
    """Lateness (start − tick time) of the expected ticks; lost (expected, never run),
    duplicated (a tick run more than once), early (started > 1 ms before its tick time)
    over every record; unexpected: a tick of no stored schedule, or off its schedule's grid."""
    first: dict[tuple[str, int], float] = {}
    counts: dict[tuple[str, int], int] = {}
    unexpected: list[list[Any]] = []
    early: list[list[Any]] = []
    pids: dict[int, int] = {}
    for name, tick, start, pid in records:
        schedule = stored.get(name)
        if schedule is None or (tick - schedule[0]) % schedule[1]:
            unexpected.append([name, tick, round(start, 3), pid])
            continue
        key = (name, tick)
        counts[key] = counts.get(key, 0) + 1
        pids[pid] = pids.get(pid, 0) + 1
        if start < tick - 1.0:
            early.append([name, tick, round(start - tick, 3), pid])
        if key not in first or start < first[key]:
            first[key] = start
    lateness = [first[key] - key[1] for key in expected if key in first]
    latest = sorted(((first[key] - key[1], key) for key in expected if key in first), reverse=True)[:20]
    lost = sorted(expected - first.keys(), key=lambda key: (key[1], key[0]))
    twice = sorted((key, c) for key, c in counts.items() if c > 1)
    return {
        "expected": len(expected),
        "ran": len(expected) - len(lost),
        "lost": len(lost),
        "duplicated": sum(c - 1 for _, c in twice),
        "early": len(early),
        "unexpected": len(unexpected),
        "lateness_ms": pct(lateness),
        "records": len(records),
        "runs_per_pid": sorted(pids.values()),
        "examples": {
            "lost": [list(key) for key in lost[:20]],
            "duplicated": [[name, tick, c] for (name, tick), c in twice[:20]],
            "early": early[:20],
            "unexpected": unexpected[:20],
            "latest": [[name, tick, round(late, 3)] for late, (name, tick) in latest],
        },
        "_lateness_samples": [round(x, 3) for x in lateness],
    }


def _tick_window(
    ctx: Ctx, w: Workers, broker: Any, keys: Any, schedules: list[tuple[str, float]], p: dict[str, Any]
) -> dict[str, Any]:
    """Wait until every schedule is stored and chained, settle, measure the window, wait for
    its ticks, remove the schedules; the window's ticks and cost."""
    n_schedules = len(schedules)
    t_ready = time.monotonic()
    deadline = t_ready + p["start_timeout"]
    while ctx.r.hlen(keys.schedules) < n_schedules or ctx.r.hlen(keys.chains) < n_schedules:
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"periodic: {ctx.r.hlen(keys.schedules)} schedules stored, {ctx.r.hlen(keys.chains)} chained "
                f"of {n_schedules} after {p['start_timeout']} s"
            )
        w.check()
        time.sleep(0.05)
    stored_s = time.monotonic() - t_ready
    time.sleep(p["settle"])
    stored = _stored(ctx.r, keys)
    wanted = {name: round(every * 1000) for name, every in schedules}
    if {name: every for name, (_, every) in stored.items()} != wanted:
        raise RuntimeError("periodic: the stored schedules are not the ones declared")

    w0 = ctx.server.now_ms()
    ctx.server.reset_stats()  # CONFIG RESETSTAT: commandstats count from here
    cpu0 = ctx.server.cpu_seconds()
    end = time.monotonic() + p["window"]
    while (left := end - time.monotonic()) > 0:
        w.check()  # the processes only: no server command during the window
        time.sleep(min(0.5, left))
    cpu_s = ctx.server.cpu_seconds() - cpu0
    stats = ctx.server.commandstats()
    w1 = ctx.server.now_ms()

    expected = _expected(stored, int(w0), int(w1))
    n = len(expected)
    deadline = time.monotonic() + p["timeout"]
    complete = False
    while time.monotonic() < deadline:
        if expected <= {(name, tick) for name, tick, _, _ in _read_ticks(ctx.r)}:
            complete = True
            break
        w.check()
        time.sleep(0.1)
    for name, _ in schedules:
        broker.redisson_scripts.schedule(keys, "remove", name)
    removed_at = ctx.server.now_ms()
    time.sleep(0.5)  # late duplicates
    res = _analyze_ticks(stored, expected, _read_ticks(ctx.r))
    seconds = (w1 - w0) / 1000
    res.update(server_work(stats, n))
    res.update(
        {
            "complete": complete,
            "schedules": n_schedules,
            "stored_after_ready_s": round(stored_s, 2),
            "window_s": round(seconds, 3),
            "per_s": round(n / seconds, 2),
            "server_cpu_us_per_msg": round(cpu_s * 1e6 / n, 1) if n else None,
            "server_cpu_ms_per_s": round(cpu_s * 1000 / seconds, 2),
            "window_ms": [round(w0, 3), round(w1, 3)],
            "removed_at_ms": round(removed_at, 3),
        }
    )
    return res


def _delayed_stream(
    ctx: Ctx, w: Workers, broker: Any, kind: str, actor: Any, rate: float, p: dict[str, Any]
) -> dict[str, Any]:
    """Plain delayed messages on the same processes, ``rate`` per second for the window's
    length, one by one as lateness-paced sends them; cost per message from just before the
    first send until the last record."""
    lo, hi = p["delay_lo"], p["delay_hi"]
    n = max(1, round(rate * p["window"]))
    rng = random.Random(22)
    dues: dict[int, float] = {}
    ctx.r.delete(REC_KEY)
    ctx.server.reset_stats()
    cpu0 = ctx.server.cpu_seconds()
    t0 = time.monotonic()
    for seq in range(n):
        time.sleep(max(0.0, t0 + seq / rate - time.monotonic()))
        m = actor.send_with_options(args=(seq,), delay=rng.randint(lo, hi))
        dues[seq] = _due(broker, kind, m)
    send_s = time.monotonic() - t0
    deadline = time.monotonic() + hi / 1000 + p["timeout"]
    polls = {"llen": 0, "lrange": 0}  # the harness's own commands, taken off below
    complete = False
    while time.monotonic() < deadline:
        polls["llen"] += 1
        if ctx.r.llen(REC_KEY) >= n:
            polls["lrange"] += 1
            if set(dues) <= {seq for seq, _, _ in read_records(ctx.r)}:
                complete = True
                break
        w.check()
        time.sleep(0.02)
    cpu_s = ctx.server.cpu_seconds() - cpu0
    stats = ctx.server.commandstats()
    seconds = time.monotonic() - t0
    for name, count in polls.items():
        calls, usec = stats.get(name, (0, 0))
        stats[name] = (calls - count, usec)
    time.sleep(0.5)  # late duplicates
    res = analyze(dues, read_records(ctx.r))
    res.update(server_work(stats, n))
    res.update(
        {
            "complete": complete,
            "send_rate": round(n / send_s, 2),
            "per_s": round(rate, 2),
            "measured_s": round(seconds, 3),
            "server_cpu_us_per_msg": round(cpu_s * 1e6 / n, 1),
            "server_cpu_ms_per_s": round(cpu_s * 1000 / seconds, 2),
            "delay_ms": [lo, hi],
        }
    )
    return res


def _due(broker: Any, kind: str, message: Any) -> float:
    """A delayed message's due time (epoch ms, server clock): the ``eta`` option the send
    sets to the time the offer stored, else what the harness's offer hook caught."""
    eta = message.options.get("eta")
    return float(eta) if eta is not None else due_of(broker, kind, message)


def _row(kind: str, what: str, res: dict[str, Any], **extra: Any) -> dict[str, Any]:
    lat = res["lateness_ms"]
    row = {
        "broker": kind,
        "what": what,
        "ran": f"{res['ran']}/{res['expected']}",
        "lost": res["lost"],
        "dup": res["duplicated"],
        "early": res["early"],
        "p50 ms": lat["p50"],
        "p99 ms": lat["p99"],
        "max ms": lat["max"],
        "per s": res["per_s"],
        "server CPU us/msg": res["server_cpu_us_per_msg"],
        "commands/msg": res["commands_per_msg"],
        "scripts/msg": res["script_calls_per_msg"],
        "script us/msg": res["script_us_per_msg"],
    }
    row.update(extra)
    return row


def _na_row(kind: str, note: str) -> dict[str, Any]:
    columns = ("ran", "lost", "dup", "early", "p50 ms", "p99 ms", "max ms", "per s")
    return {
        "broker": kind,
        "what": note,
        **dict.fromkeys(columns, "n/a"),
        **dict.fromkeys(("server CPU us/msg", "commands/msg", "scripts/msg", "script us/msg"), "n/a"),
    }


def _has_periodic() -> bool:
    import dramatiq_redisson

    return hasattr(dramatiq_redisson, "periodic")


def periodic(ctx: Ctx) -> dict[str, Any]:
    """Periodic ticks: lateness, lost, duplicated, early; server cost per tick against a
    plain delayed message's on the same processes at the same rate."""
    lp = ctx.p["lateness_paced"]
    p = {
        **COMMON,
        **SIZES[ctx.size],
        "threads": ctx.p["threads"],
        "delay_lo": lp["delay_lo"],
        "delay_hi": lp["delay_hi"],
    }
    data: dict[str, Any] = {"params": p}
    rows: list[dict[str, Any]] = []
    targets: list[dict[str, Any]] = []
    for kind in ctx.brokers:
        note = NOT_APPLICABLE.get(kind)
        if note is None and not _has_periodic():
            note = "n/a: the dramatiq_redisson measured has no periodic actors"
        if note is not None:
            data[kind] = {"not_applicable": note}
            rows.append(_na_row(kind, note))
            continue
        ctx.server.flush()
        broker, actor = ctx.producer(kind)
        keys = broker.keys(QUEUE)
        schedules = _schedules(p["schedules"], p["every_lo"], p["every_hi"])
        ctx.log(
            f"periodic/{kind}: {p['schedules']} schedules every {p['every_lo']}-{p['every_hi']} s on "
            f"{p['procs']} worker processes x {p['threads']} threads, {p['window']} s; then delayed messages "
            f"({p['delay_lo']}-{p['delay_hi']} ms) at the tick rate"
        )
        with Workers(kind, ctx.server.url, p["procs"], p["threads"], options={"periodic": schedules}) as w:
            ticks = _tick_window(ctx, w, broker, keys, schedules, p)
            ctx.log(
                f"periodic/{kind}: {ticks['ran']}/{ticks['expected']} ticks ran; delayed messages at {ticks['per_s']}/s"
            )
            delayed = _delayed_stream(ctx, w, broker, kind, actor, ticks["per_s"], p)
            after = [rec for rec in _read_ticks(ctx.r) if rec[1] > ticks["removed_at_ms"]]
        ctx.check_crash("periodic", kind, w)
        broker.close()
        ticks["ran_after_remove"] = len(after)
        ticks["examples"]["ran_after_remove"] = [list(rec) for rec in after[:20]]
        ctx.check_delivery("periodic/ticks", kind, ticks)
        ctx.check_delivery("periodic/delayed", kind, delayed)
        if after and kind in PRODUCT_KINDS:
            ctx.fail(f"periodic/{kind}: {len(after)} ticks due after their schedules were removed ran")
        data[kind] = {"ticks": ticks, "delayed": delayed}
        cpu_ratio = _ratio(ticks["server_cpu_us_per_msg"], delayed["server_cpu_us_per_msg"])
        commands_ratio = _ratio(ticks["commands_per_msg"], delayed["commands_per_msg"])
        rows.append(
            _row(
                kind,
                f"periodic ticks ({p['schedules']} schedules, every {p['every_lo']:g}-{p['every_hi']:g} s)",
                ticks,
                **{"CPU vs delayed": cpu_ratio, "commands vs delayed": commands_ratio},
            )
        )
        rows.append(_row(kind, f"delayed messages at the same rate ({p['delay_lo']}-{p['delay_hi']} ms)", delayed))
        lat = ticks["lateness_ms"]
        targets += [
            {
                "target": "periodic: tick lateness p99 <= 5 ms",
                "value": lat["p99"],
                "met": lat["p99"] is not None and lat["p99"] <= 5,
            },
            {
                "target": "periodic: server CPU per tick <= per delayed message (same processes, same rate)",
                "value": f"{_r(ticks['server_cpu_us_per_msg'])} vs {_r(delayed['server_cpu_us_per_msg'])} us",
                "met": cpu_ratio is not None and cpu_ratio <= 1,
            },
        ]
    return {"data": data, "rows": rows, "targets": targets}
