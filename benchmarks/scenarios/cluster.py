"""``cluster``: a Redis Cluster: per-node cost, many queues, a failover."""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .._actor import declare
from .._base import HOUR_MS, NAMESPACE
from .._brokers import make_broker
from .._measure import REC_KEY, analyze, median_merge, pct, read_records, wait_records
from .._server import Server, ServerGroup
from .._workers import Workers
from ._cluster_shards import cluster_shards, memory_rows, saturation_rows, shard_memory, shard_params, shard_targets
from ._shared import Ctx, _ratio

#: The queues of part (c) are this one and the next ``bench-failover-<i>`` on the same
#: master (the one killed); those of parts (a) and (b) are ``bench-0``, ``bench-1``, …
#: (their names decide their slots, and so their masters).
FAILOVER_QUEUE = "bench-failover"


#: Part (c)'s steady-state lateness counts the messages due this long (ms) before the kill.
STEADY_MARGIN_MS = 500


#: Each producer of part (c) (one per repeat and variant) numbers its messages from a multiple of this.
FAILOVER_SEQS = 10_000_000

#: Replication is asynchronous, and acks are never waited for (docs/scaling.md): the
#: promoted replica may lack what its master acknowledged this long (ms) before the kill,
#: so a message whose first run began between then and the promotion (plus this much
#: again, for messages fetched before the kill) may run again: an explained duplicate, as
#: the fault suite counts them (``FAILOVER_LOSS_MS`` in tests/connection/test_cluster.py).
FAILOVER_LOSS_MS = 1000


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
    ctx: Ctx, sends: list[Any], records: list[tuple[int, float, int]], kill_ms: float, promoted_ms: float
) -> dict[str, Any]:
    """Lost, duplicated (unexplained, and explained by the failover: see
    :data:`FAILOVER_LOSS_MS`), early (from the records), and when delayed messages ran
    again."""
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
    window = (kill_ms - FAILOVER_LOSS_MS, promoted_ms + FAILOVER_LOSS_MS)
    twice = {seq: n - 1 for seq, n in runs.items() if n > 1 and (seq in ok or seq in floor)}
    explained = {seq: n for seq, n in twice.items() if window[0] <= first[seq] <= window[1]}
    res["duplicated"] -= sum(explained.values())
    res["dup_explained"] = sum(explained.values())
    for seq in sorted(twice):
        starts = sorted(start - kill_ms for s, start, _ in records if s == seq)
        ctx.log(
            f"cluster/failover: message {seq} ran {len(starts)} times, at "
            f"{', '.join(f'{t:+.0f}' for t in starts)} ms from the kill (promoted at "
            f"{promoted_ms - kill_ms:+.0f} ms): {'explained' if seq in explained else 'UNEXPLAINED'}"
        )
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
        res = _failover_analysis(ctx, sends[v.wait], records, kill_ms, kill_ms + promoted_s * 1000)
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
                    f"lost {res['lost']}, dup {res['duplicated']} (+{res['dup_explained']} explained), "
                    f"early {res['early']}"
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
    from a master's SIGKILL with workers running; (d)–(f) one queue over 1 and over N
    shards (issue 36: ``_cluster_shards``). Records stay on the harness's server."""
    try:
        from tests.harness.topology import Cluster
    except ImportError as e:  # run from the checkout's root: tests/ is next to benchmarks/
        raise RuntimeError(f"the cluster scenario needs tests/harness/topology.py (run from the checkout): {e}") from e

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
        counts = p.get("shard_counts", [1, 6])
        shards = [cluster_shards(ctx, c, _cluster_topology(ctx, c), count) for count in counts]
        memory = (
            [shard_memory(ctx, c, _cluster_topology(ctx, c), count) for count in counts]
            if shard_params(ctx)["shard_memory"]
            else []
        )
        failover = _cluster_failover(ctx, c)
    # (d)'s control: the same queue and load on a server of its own, the cluster stopped.
    control_server = Server(None)
    try:
        control_topo = _Topology(
            label="one server (control)",
            url=control_server.url,
            options={},
            masters=lambda: [control_server.r],
            flush=control_server.flush,
            master_of=lambda queue: "one server",
        )
        shards += [cluster_shards(ctx, None, control_topo, count) for count in counts]
    finally:
        control_server.stop()
    data.update(
        {
            "costs": costs,
            "cost_runs": cost_runs,
            "many": many,
            "shards": shards,
            "shard_memory": memory,
            "failover": {str(k): v for k, v in failover.items()},
        }
    )
    single, clustered = (t.label for t in topos)

    rows_a = _cost_rows(costs, single, clustered)
    tables["(a) cost per message: single server vs cluster"] = rows_a

    rows_b = _many_rows(many, single, clustered)
    tables["(b) many queues over the masters: paced lateness, burst throughput"] = rows_b

    tables["(d) one queue over 1 and over N shards: each master's share of server CPU"] = [
        {
            "where": run["where"],
            "shards": run["shards"],
            "on the masters": run["placed"],
            "CPU share per master": run["cpu_share"],
            "ran": f"{run['ran']}/{run['expected']}",
            "lateness p50 ms": run["lateness"]["p50"],
            "lateness p99 ms": run["lateness"]["p99"],
            "server CPU µs/msg": run["server_cpu_us_per_msg"],
            "commands/msg": run["commands_per_msg"],
            "script µs/msg": run["script_us_per_msg"],
        }
        for run in shards
    ]

    if any(run["saturation"] for run in shards):
        tables[
            "(e) saturation of one queue over 1 and over N shards: measured here, computed for a core per master"
        ] = saturation_rows(shards)
    if memory:
        tables["(f) server memory per scheduled message, one queue over 1 and over N shards"] = memory_rows(memory)

    rows_c = _failover_rows(ctx, failover)
    tables["(c) failover: SIGKILL of the queue's master, workers running"] = rows_c
    rows = [{"part": title, **row} for title, part in tables.items() for row in part] + notes
    if notes:
        tables["not run"] = notes

    targets = _cluster_targets(costs, single, clustered, rows_c) + shard_targets(shards, memory)
    return {"data": data, "rows": rows, "tables": tables, "targets": targets}


def _cost_rows(costs: dict[str, Any], single: str, clustered: str) -> list[dict[str, Any]]:
    """Table (a): cost per message, single server vs cluster."""
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
    return rows_a


def _many_rows(many: dict[str, Any], single: str, clustered: str) -> list[dict[str, Any]]:
    """Table (b): many queues over the masters."""
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
    return rows_b


def _failover_rows(ctx: Ctx, failover: dict[int, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Table (c): failover, one row per ``wait_for_replicas``; fails the run on a message
    never sent, duplicated (not explained by the failover), early or (with
    ``wait_for_replicas``) lost."""
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
                "dup explained": sum(r["dup_explained"] for r in reps),
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
                ctx.fail(f"{name}: {r['duplicated']} duplicated messages, not explained by the failover")
            if r["early"]:
                ctx.fail(f"{name}: {r['early']} messages started before their due time")
            if r["lost"] and wait:
                ctx.fail(f"{name}: {r['lost']} accepted messages lost")
            elif r["lost"]:
                ctx.log(f"{name}: {r['lost']} accepted messages lost (asynchronous replication; reported, not failed)")
            if r["flow_again_s"] is None:
                ctx.fail(f"{name}: no delayed message due after the kill ran")
    return rows_c


def _cluster_targets(
    costs: dict[str, Any], single: str, clustered: str, rows_c: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """The scenario's targets: cost ratios, flow-again times, no loss with wait_for_replicas=1."""
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
            "target": "failover with wait_for_replicas=1: no accepted message lost, none twice (but those a lost "
            "ack explains), none early",
            "value": f"lost {one['lost']}, dup {one['dup']}, early {one['early']}",
            "met": not (one["lost"] or one["dup"] or one["early"]),
        }
    )
    return targets
