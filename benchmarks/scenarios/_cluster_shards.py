"""Part (d) of the ``cluster`` scenario (issue 36): one queue over 1, then over N shards of
a 3-master cluster, at one offered load: each master's share of the masters' server CPU,
lateness, commands and script µs per message."""

from __future__ import annotations

import random
import time
from collections import Counter
from typing import Any

from .._actor import declare
from .._common import ServerGroup, Workers, make_broker
from .._measure import REC_KEY, analyze, read_records, wait_records
from ._shared import Ctx

#: The queue of part (d): one queue over 1, then over N shards (issue 36).
SHARDED_QUEUE = "bench-sharded"


def cluster_shards(ctx: Ctx, cluster: Any, topo: Any, count: int) -> dict[str, Any]:
    """(d) One queue over ``count`` shards (issue 36; 1: not sharded), at the offered load
    of part (b): each master's share of the masters' server CPU, lateness, and the
    commands and script µs per message, summed over the masters."""
    p = ctx.p["cluster"]
    topo.flush()
    ctx.r.delete(REC_KEY)
    options: dict[str, Any] = {"cluster": True}
    if count > 1:
        options["shards"] = {SHARDED_QUEUE: count}
    broker = make_broker("redisson", topo.url, **options)
    actor = declare(broker, SHARDED_QUEUE, record=ctx.r)
    names = broker.shard_router.consumed(SHARDED_QUEUE)
    masters = {m.name: ServerGroup([cluster.admin(m)]) for m in cluster.masters}
    placed = Counter(topo.master_of(name) for name in names)
    rng = random.Random(13)
    n, rate = p["paced_n"], p["rate"]
    worker_options = {"broker": options, "queues": [SHARDED_QUEUE], "record_url": ctx.server.url}
    ctx.log(f"cluster/shards/{count}: {n} delayed messages at {rate}/s on one queue over {count} shards {dict(placed)}")
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
        ctx.check_delivery(f"cluster/shards/{count}", "redisson", res)
    ctx.check_crash("cluster/shards", str(count), w)
    broker.close()
    total_cpu = sum(cpu.values()) or None
    calls = sum(c for c, _ in commands.values())
    usec = sum(u for _, u in commands.values())
    return {
        "shards": count,
        "placed": dict(placed),
        "cpu_share": {name: round(c / total_cpu, 3) if total_cpu else None for name, c in sorted(cpu.items())},
        "server_cpu_us_per_msg": round(sum(cpu.values()) * 1e6 / n, 1),
        "commands_per_msg": round(calls / n, 2),
        "script_us_per_msg": round(usec / n, 1),
        "lateness": res["lateness_ms"],
        "ran": res["ran"],
        "expected": n,
    }


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
