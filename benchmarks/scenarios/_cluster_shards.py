"""Parts (d), (e) and (f) of the ``cluster`` scenario (issue 36): one queue over 1, then
over N shards of a 3-master cluster. (d) at one offered load: each master's share of the
masters' server CPU, lateness, commands and script µs per message. (e) saturation, on the
same worker processes: offered as fast as the producer goes, the measured throughput and,
from each master's CPU per message, the throughput the masters would reach on a core each
(computed). (f) server memory per scheduled message, summed over the masters."""

from __future__ import annotations

import random
import time
from collections import Counter
from typing import Any

from .._actor import declare
from .._base import HOUR_MS
from .._brokers import bulk_offer, make_broker
from .._measure import REC_KEY, analyze, read_records, wait_records
from .._server import Server, ServerGroup
from .._workers import Workers
from ._shared import Ctx, _ratio
from .saturation import offer_stage

#: The queue of parts (d), (e) and (f): one queue over 1, then over N shards (issue 36).
SHARDED_QUEUE = "bench-sharded"

#: Part (e) numbers its messages from here (part (d)'s run from 0).
SATURATION_SEQS = 1_000_000

#: Parts (e) and (f) per size (kept here rather than in _base.SIZES, as operations'
#: and periodic's: only they read them). A ``cluster.shard_saturation`` or
#: ``cluster.shard_memory`` of the size (``--set``, a whole value) takes precedence; None
#: skips the part. (e): ``n`` messages offered as fast as possible, ``chunk`` per
#: ``enqueue_many``, due in ``delay`` ms, all run within ``timeout`` s after the last
#: offer; ``idle_s`` of idle CPU measured first. (f): messages scheduled, at least 512 per
#: shard of 6 (below ``hash-max-listpack-entries`` a payload hash is a listpack).
SHARD_SIZES: dict[str, dict[str, Any]] = {
    "tiny": {
        "shard_saturation": {"n": 400, "chunk": 100, "delay": 300, "timeout": 30, "idle_s": 0.5},
        "shard_memory": 6_000,
    },
    "small": {
        "shard_saturation": {"n": 10_000, "chunk": 100, "delay": 1000, "timeout": 60, "idle_s": 1.0},
        "shard_memory": 30_000,
    },
    "full": {
        "shard_saturation": {"n": 30_000, "chunk": 100, "delay": 1000, "timeout": 120, "idle_s": 2.0},
        "shard_memory": 200_000,
    },
}

#: Part (f) reads its base memory this long (s) after the flush: a master releases ~17 KB
#: of an emptied keyspace's tables at a later cron tick (seen on the masters that hold no
#: shard), which a reading right after the flush would count as freed by the offer.
MEMORY_SETTLE_S = 1.0


def shard_params(ctx: Ctx) -> dict[str, Any]:
    """The parameters of parts (e) and (f) for the run's size (see :data:`SHARD_SIZES`)."""
    out = dict(SHARD_SIZES[ctx.size])
    out.update({key: ctx.p["cluster"][key] for key in out if key in ctx.p["cluster"]})
    return out


def _sharded_queue(ctx: Ctx, topo: Any, count: int) -> tuple[dict[str, Any], Any, Any, Counter[str]]:
    """The broker options of one queue over ``count`` shards (1: not sharded), a broker with
    them, the queue's recording actor and how many shards each master holds."""
    options: dict[str, Any] = dict(topo.options)
    if count > 1:
        options["shards"] = {SHARDED_QUEUE: count}
    broker = make_broker("redisson", topo.url, **options)
    actor = declare(broker, SHARDED_QUEUE, record=ctx.r)
    placed = Counter(topo.master_of(name) for name in broker.shard_router.consumed(SHARDED_QUEUE))
    return options, broker, actor, placed


def cluster_shards(ctx: Ctx, cluster: Any, topo: Any, count: int) -> dict[str, Any]:
    """(d) One queue over ``count`` shards (issue 36; 1: not sharded), at the offered load
    of part (b): each master's share of the masters' server CPU, lateness, and the
    commands and script µs per message, summed over the masters.

    ``cluster`` None: the control, ``topo`` a server of its own: the same queue, workers
    and load on one server, where the shards' own cost shows without the spread over
    masters (each server waking for fewer commands at a time, three servers sharing this
    machine's cores). Part (e) is not run there."""
    p = ctx.p["cluster"]
    topo.flush()
    ctx.r.delete(REC_KEY)
    options, broker, actor, placed = _sharded_queue(ctx, topo, count)
    if cluster is None:
        masters = {"one server": ServerGroup(topo.masters())}
    else:
        masters = {m.name: ServerGroup([cluster.admin(m)]) for m in cluster.masters}
    rng = random.Random(13)
    n, rate = p["paced_n"], p["rate"]
    worker_options = {"broker": options, "queues": [SHARDED_QUEUE], "record_url": ctx.server.url}
    part = "cluster/shards" if cluster is not None else "cluster/shards-control"
    ctx.log(f"{part}/{count}: {n} delayed messages at {rate}/s on one queue over {count} shards {dict(placed)}")
    with Workers("redisson", topo.url, ctx.p["procs"], ctx.p["threads"], options=worker_options) as w:
        time.sleep(p["settle"])
        for group in masters.values():
            group.reset_stats()
        cpu0 = {name: group.cpu_seconds() for name, group in masters.items()}
        dues: dict[int, float] = {}
        t0 = time.monotonic()
        for seq in range(n):
            time.sleep(max(0.0, t0 + seq / rate - time.monotonic()))
            m = actor.send_with_options(args=(seq,), delay=rng.randint(p["delay_lo"], p["delay_hi"]))
            dues[seq] = float(m.options["eta"])
        deadline = time.monotonic() + max(0.0, (max(dues.values()) - ctx.server.now_ms()) / 1000) + p["timeout"]
        complete = wait_records(ctx.r, dues, deadline, check=w.check)
        cpu = {name: group.cpu_seconds() - cpu0[name] for name, group in masters.items()}
        commands = {name: _commands(group) for name, group in masters.items()}
        res = analyze(dues, read_records(ctx.r))
        res["complete"] = complete
        ctx.check_delivery(f"{part}/{count}", "redisson", res)
        sat = shard_params(ctx)["shard_saturation"] if cluster is not None else None
        saturation = _saturation(ctx, cluster, broker, actor, sat, w, count) if sat else None
    ctx.check_crash(part, str(count), w)
    broker.close()
    total_cpu = sum(cpu.values()) or None
    calls = sum(c for c, _ in commands.values())
    usec = sum(u for _, u in commands.values())
    return {
        "shards": count,
        "where": topo.label,
        "placed": dict(placed),
        "cpu_share": {name: round(c / total_cpu, 3) if total_cpu else None for name, c in sorted(cpu.items())},
        "server_cpu_us_per_msg": round(sum(cpu.values()) * 1e6 / n, 1),
        "commands_per_msg": round(calls / n, 2),
        "script_us_per_msg": round(usec / n, 1),
        "lateness": res["lateness_ms"],
        "ran": res["ran"],
        "expected": n,
        "saturation": saturation,
    }


def _saturation(
    ctx: Ctx, cluster: Any, broker: Any, actor: Any, sat: dict[str, Any], w: Workers, count: int
) -> dict[str, Any]:
    """(e) On part (d)'s worker processes, once its messages ran: each master's CPU per
    second while the workers idle (``idle_s``), then ``n`` delayed messages offered as fast
    as the producer goes (``enqueue_many`` of ``chunk``: the saturation scenario's stage),
    and run. Measured: messages run per second from the first due time to the last start,
    lateness; each master's server CPU per message over the stage (offer, move, fetch,
    ack, its replica's feed, and what it spends per second whatever the load). Computed:
    the throughput if every master had a core of its own, bounded by the busiest one: 1 /
    its CPU seconds per message (conservative where a master's CPU per second idle is a
    large part: at a higher rate that part is shared by more messages)."""
    ctx.r.delete(REC_KEY)
    # Each master as a Server (INFO cpu, commandstats), for the saturation scenario's stage.
    masters = {m.name: Server("redis://{}:{}".format(*m.address)) for m in cluster.masters}
    try:
        # Each master's CPU per second with the workers idle (their consumers' polls, lease
        # renewals and heartbeats, the cluster bus): part of the CPU per message below.
        idle_s = sat.get("idle_s", 1.0)
        cpu0 = {name: server.cpu_seconds() for name, server in masters.items()}
        time.sleep(idle_s)
        idle = {name: round((m.cpu_seconds() - cpu0[name]) * 1000 / idle_s, 2) for name, m in masters.items()}
        ctx.log(
            f"cluster/shards/{count}/saturation: {sat['n']} delayed messages ({sat['delay']} ms) offered as fast "
            f"as possible, {sat['chunk']} per enqueue_many, on one queue over {count} shards"
        )
        res = offer_stage(ctx, broker, "redisson", actor, None, SATURATION_SEQS, sat, servers=masters, check=w.check)
    finally:
        for server in masters.values():
            server.stop()
    ctx.check_delivery(f"cluster/shards/{count}/saturation", "redisson", res)
    by_master = res["server_cpu_us_per_msg_by_server"]
    busiest = max(by_master, key=lambda name: by_master[name]) if by_master else None
    busiest_us = by_master[busiest] if busiest else None
    return {
        "params": sat,
        "n": sat["n"],
        "ran": res["ran"],
        "complete": res["complete"],
        "offered_per_s": res["offered_per_s"],
        "measured_per_s": res["throughput_per_s"],
        "lateness": res["lateness_ms"],
        "server_cpu_us_per_msg": res["server_cpu_us_per_msg"],
        "cpu_us_per_msg_by_master": by_master,
        "cpu_pct_by_master": res["server_cpu_pct_by_server"],
        "idle_cpu_ms_per_s_by_master": dict(sorted(idle.items())),
        "busiest_master": busiest,
        "computed_per_s": round(1e6 / busiest_us) if busiest_us else None,
        "commands_per_msg": res["commands_per_msg"],
        "script_calls_per_msg": res["script_calls_per_msg"],
        "script_us_per_msg": res["script_us_per_msg"],
    }


def shard_memory(ctx: Ctx, cluster: Any, topo: Any, count: int) -> dict[str, Any]:
    """(f) Server memory per scheduled message, one queue over ``count`` shards (1: not
    sharded): ``n`` messages due in an hour (``enqueue_many``, as the ``memory``
    scenario's offers), no workers. Per master: the ``used_memory`` delta less the
    replication buffers' (the backlog fills as the writes stream to the replica, up to
    ``repl-backlog-size``: megabytes that are not the messages') and the normal clients'
    buffers; summed over the masters and divided by ``n``. ``n`` / ``count`` should stay
    above ``hash-max-listpack-entries`` (512 here): a shard's smaller payload hash is a
    listpack, ~20 B less per message, which a production queue of that size would have
    too but which is no cost of sharding."""
    n = shard_params(ctx)["shard_memory"]
    topo.flush()
    _, broker, actor, placed = _sharded_queue(ctx, topo, count)
    clients = {m.name: cluster.admin(m) for m in cluster.masters}
    ctx.log(f"cluster/memory/{count}: {n} scheduled on one queue over {count} shards {dict(placed)}")
    # Warm-up: one message per shard (the layout stored, scripts loaded on every master).
    bulk_offer(broker, "redisson", actor, list(range(-count, 0)), HOUR_MS)
    time.sleep(MEMORY_SETTLE_S)
    base = {name: _memory(client) for name, client in clients.items()}
    bulk_offer(broker, "redisson", actor, list(range(n)), HOUR_MS)
    after = {name: _memory(client) for name, client in clients.items()}
    shards = broker.shard_router.consumed(SHARDED_QUEUE)
    stored = sum(int(broker.client.zcard(broker.keys(name).timeout_zset)) for name in shards)
    broker.close()
    if stored != n + count:
        ctx.fail(f"cluster/memory/{count}: {stored} scheduled after offering {n + count}")
    data = {name: after[name][0] - base[name][0] for name in clients}
    raw = {name: after[name][1] - base[name][1] for name in clients}
    return {
        "shards": count,
        "where": topo.label,
        "placed": dict(placed),
        "scheduled": n,
        "bytes_per_msg": round(sum(data.values()) / n, 1),
        "bytes_per_msg_by_master": {name: round(b / n, 1) for name, b in sorted(data.items())},
        "used_memory_delta_per_msg": round(sum(raw.values()) / n, 1),
    }


def saturation_rows(shards: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Table (e): per shard count, the measured row, then the computed one."""
    rows = []
    base = next((run["saturation"] for run in shards if run["shards"] == 1 and run["saturation"]), None)
    for run in shards:
        sat = run["saturation"]
        if not sat:
            continue
        lat = sat["lateness"]
        cpu = sat["cpu_us_per_msg_by_master"]
        common = {"shards": run["shards"], "on the masters": run["placed"]}
        rows.append(
            {
                **common,
                "figure": "measured (this machine: masters, producer, 2 x 4 workers on 2 shared cores)",
                "msgs/s": sat["measured_per_s"],
                "vs 1 shard": _ratio(sat["measured_per_s"], base["measured_per_s"]) if base else None,
                "ran": f"{sat['ran']}/{sat['n']}",
                "offered/s": sat["offered_per_s"],
                "lateness p50 ms": lat["p50"],
                "lateness p99 ms": lat["p99"],
                "CPU µs/msg per master": " / ".join(f"{k}: {v}" for k, v in cpu.items()),
                "CPU % per master": " / ".join(f"{k}: {v}" for k, v in sat["cpu_pct_by_master"].items()),
                "idle CPU ms/s per master": " / ".join(
                    f"{k}: {v}" for k, v in sat["idle_cpu_ms_per_s_by_master"].items()
                ),
            }
        )
        rows.append(
            {
                **common,
                "figure": "computed (a core per master: 1 / busiest master's CPU s/msg)",
                "msgs/s": sat["computed_per_s"],
                "vs 1 shard": _ratio(sat["computed_per_s"], base["computed_per_s"]) if base else None,
                "CPU µs/msg per master": f"busiest {sat['busiest_master']}: {cpu.get(sat['busiest_master'])}",
            }
        )
    return rows


def memory_rows(memory: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Table (f): bytes per scheduled message, per shard count."""
    base = next((run for run in memory if run["shards"] == 1), None)
    return [
        {
            "shards": run["shards"],
            "on the masters": run["placed"],
            "scheduled": run["scheduled"],
            "bytes/msg (sum over masters)": run["bytes_per_msg"],
            "vs 1 shard": _ratio(run["bytes_per_msg"], base["bytes_per_msg"]) if base else None,
            "bytes/msg per master": " / ".join(f"{k}: {v}" for k, v in run["bytes_per_msg_by_master"].items()),
            "used_memory delta/msg (replication buffers included)": run["used_memory_delta_per_msg"],
        }
        for run in memory
    ]


def shard_targets(shards: list[dict[str, Any]], memory: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Issue 36's goals for (d), (e) and (f): commands and server CPU per message with N
    shards ≤ 1.1× one shard's (on the cluster, and on one server: the control), memory
    ≤ unsharded + 5 %; saturation informative."""
    targets = []
    for where in dict.fromkeys(run.get("where", "") for run in shards):
        runs = {run["shards"]: run for run in shards if run.get("where", "") == where}
        if 1 not in runs or len(runs) < 2:
            continue
        n = max(runs)
        for what, field in (("commands", "commands_per_msg"), ("server CPU µs", "server_cpu_us_per_msg")):
            ratio = _ratio(runs[n][field], runs[1][field])
            targets.append(
                {
                    "target": f"{what} per message, {n} shards <= 1.1x 1 shard ({where}; issue 36)",
                    "value": f"{runs[n][field]} vs {runs[1][field]} = {ratio}x",
                    "met": ratio <= 1.1 if ratio is not None else None,
                }
            )
    sats = {run["shards"]: run["saturation"] for run in shards if run["saturation"]}
    if 1 in sats and len(sats) > 1:
        n = max(sats)
        one, many = sats[1], sats[n]
        targets.append(
            {
                "target": f"(saturation, 1 vs {n} shards: measured msgs/s here; computed msgs/s, a core per master)",
                "value": f"{one['measured_per_s']} vs {many['measured_per_s']}; "
                f"{one['computed_per_s']} vs {many['computed_per_s']} "
                f"= {_ratio(many['computed_per_s'], one['computed_per_s'])}x",
                "met": None,
            }
        )
    by_count = {run["shards"]: run for run in memory}
    if 1 in by_count and len(by_count) > 1:
        n = max(by_count)
        one, many = by_count[1]["bytes_per_msg"], by_count[n]["bytes_per_msg"]
        ratio = _ratio(many, one)
        targets.append(
            {
                "target": f"server bytes per scheduled message, {n} shards <= 1 shard + 5 % (issue 36)",
                "value": f"{many} vs {one} = {ratio}x",
                "met": (ratio <= 1.05) if ratio is not None and one > 0 else None,
            }
        )
    return targets


def _memory(client: Any) -> tuple[int, int]:
    """(``used_memory`` less the replication buffers and normal clients' buffers, raw
    ``used_memory``) of one server."""
    info = client.info("memory")
    used = int(info["used_memory"])
    replication = info.get("mem_total_replication_buffers")
    if replication is None:  # before Valkey / Redis 7: the backlog and the replicas' buffers apart
        replication = int(info.get("mem_replication_backlog", 0)) + int(info.get("mem_clients_slaves", 0))
    return used - int(replication) - int(info.get("mem_clients_normal", 0)), used


def _commands(group: ServerGroup) -> tuple[int, int]:
    """Every command's calls and µs on the group's servers since its reset (scripts
    counted with the commands they ran)."""
    calls = usec = 0
    for client in group.clients:
        for name, entry in client.info("commandstats").items():
            if name.startswith("cmdstat_") and name not in ("cmdstat_config", "cmdstat_info"):
                calls += int(entry["calls"])
                usec += int(entry["usec"]) if name == "cmdstat_evalsha" else 0
    return calls, usec
