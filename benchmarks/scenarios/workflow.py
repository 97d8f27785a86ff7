"""``workflow``: the broker's workflows (issue 57) against Dramatiq's own group completion
callbacks, in three parts.

1. **Fan-out** (RedissonBroker and Dramatiq's ``RedisBroker``, with the same worker
   processes each): ``runs`` times, a group of ``members`` no-op steps and one completion
   step after it, one run at a time. Ours: ``chain(group([...]), done.message(...)).run()``;
   theirs: ``group([...]).add_completion_callback(done.message(...)).run()`` with
   Dramatiq's ``GroupCallbacks`` middleware, its barriers in ``RedisBackend`` on the same
   server. Each member records when its body ended and the completion step when it
   started, on the server's clock (``_actor.declare_workflow``); per run: completion start
   − the last member's end, how many times the completion started (exactly once, else
   the run failed), and the run's total time (from just before ``.run()`` to the
   completion's start).
2. **Cost per step** (RedissonBroker): ``cost_n`` steps sent as plain messages
   (``actor.send``), then as workflow steps (chains of ``chain`` steps, each run with
   ``.run()``), each phase to the end with the workers of part 1: server commands
   (inside scripts or not, the script calls themselves apart), script calls (EVALSHA and
   FCALL) and server CPU per message, from ``INFO commandstats`` and ``INFO cpu`` over
   the phase (the recorder's commands and the harness's polling taken off; the workers'
   idle polling over the phase is counted, as in the harness's other per-message costs),
   and how many of the script calls the sender made (counted in its redis-py: the sends;
   the runs and their first steps), the rest being the workers'.
3. **Sending a big workflow** (RedissonBroker, no worker running): ``.run()`` of a group
   of ``send_n`` steps against ``broker.enqueue_many`` of as many plain messages, each
   from an empty server, ``send_repeat`` times each, alternating: wall time of the call
   (messages built beforehand; ``.run()`` compiles its tree inside), the commands the
   client sent (counted in redis-py's command packer) and the script calls the server ran.

``redisson-lrem`` is not run: its workflows and sends are RedissonBroker's.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

from .._actor import WF_DONE_KEY, WF_END_KEY, declare_workflow
from .._base import PRODUCT_KINDS, QUEUE
from .._brokers import make_broker
from .._measure import CommandCounter, counter_slots, pct, read_records, server_work
from .._workers import Workers
from ._shared import Ctx, _ratio

#: A fan-out member's seq: its run × this + its index in the group.
SEQ_RUN = 1_000_000
#: Seconds between two fan-out runs, so that each starts on an idle fleet.
RUN_PAUSE_S = 0.1
#: Seconds between two looks at a record list while waiting.
POLL_S = 0.02
#: Targets of issue 57.
FAN_OUT_P99_MS = 5.0
EXTRA_COMMANDS_PER_STEP = 3.0
EXTRA_SCRIPT_CALLS_PER_STEP = 1.0
SEND_RATIO = 2.0


def workflow(ctx: Ctx) -> dict[str, Any]:
    """Fan-out latency, cost per step and the send of a big workflow (see the module)."""
    p = ctx.p["workflow"]
    data: dict[str, Any] = {"params": p}
    fan_rows: list[dict[str, Any]] = []
    cost_rows: list[dict[str, Any]] = []
    send_rows: list[dict[str, Any]] = []
    for kind in ctx.brokers:
        if kind not in ("redisson", "builtin"):
            fan_rows.append({"broker": kind, "runs": "(not run: the same workflows as redisson)"})
            continue
        ctx.server.flush()
        broker = make_broker(kind, ctx.server.url)
        member, done = declare_workflow(broker)
        slots = counter_slots(ctx.server.command_names())
        workers = Workers(
            kind,
            ctx.server.url,
            ctx.p["procs"],
            ctx.p["threads"],
            count_slots=slots,
            options={"workflow": True},
        )
        with workers as w:
            ctx.log(f"workflow/{kind}: {p['runs']} runs of a group of {p['members']} and a completion step")
            fan = _fan_out(ctx, kind, broker, member, done, p, w)
            data[kind] = {"fan_out": fan}
            fan_rows.append(_fan_row(kind, fan))
            if kind == "redisson":
                ctx.log(f"workflow/{kind}: {p['cost_n']} steps as plain messages, then as chains of {p['chain']}")
                data["cost"] = _cost(ctx, broker, member, p, w, slots)
                cost_rows += data["cost"]["rows"]
            w.check()
        ctx.check_crash("workflow", kind, w)
        broker.close()
    if "redisson" in ctx.brokers:
        ctx.log(f"workflow/redisson: run() of a group of {p['send_n']} vs enqueue_many, no workers")
        data["send"] = _send(ctx, p)
        send_rows = data["send"]["rows"]
    tables = {
        "fan-out: completion start - last member's end (server clock)": fan_rows,
        "cost per step: a plain message vs a workflow step (per message)": cost_rows,
        "sending a big workflow: run() of a group vs enqueue_many (no workers)": send_rows,
    }
    return {
        "data": data,
        "rows": fan_rows + cost_rows + send_rows,
        "tables": {title: rows for title, rows in tables.items() if rows},
        "targets": _targets(data),
    }


# -- 1. fan-out ---------------------------------------------------------------------------


def _fan_out(ctx: Ctx, kind: str, broker: Any, member: Any, done: Any, p: dict[str, Any], w: Workers) -> dict[str, Any]:
    """``p["runs"]`` fan-outs, one at a time; each run waits for a completion to start
    (or ``p["timeout"]`` s), then the records are read once, after ``p["grace"]`` s for
    late duplicates."""
    from dramatiq import group as dramatiq_group

    from dramatiq_redisson.workflows import chain, group

    sent_ms: list[float] = []
    timed_out: list[int] = []
    for run in range(p["runs"]):
        steps = [member.message(run * SEQ_RUN + i) for i in range(p["members"])]
        before = int(ctx.r.llen(WF_DONE_KEY))
        sent_ms.append(ctx.server.now_ms())
        if kind == "builtin":
            theirs = dramatiq_group(steps, broker=broker)
            theirs.add_completion_callback(done.message(run))
            theirs.run()
        else:
            # The group's result (a list of nulls) is not passed on: theirs gets none either.
            chain(group(steps), done.message_with_options(args=(run,), pipe_ignore=True)).run(broker=broker)
        deadline = time.monotonic() + p["timeout"]
        while int(ctx.r.llen(WF_DONE_KEY)) <= before:
            if time.monotonic() > deadline:
                timed_out.append(run)
                ctx.log(f"workflow/{kind}: run {run}: no completion within {p['timeout']} s")
                break
            w.check()
            time.sleep(POLL_S)
        time.sleep(RUN_PAUSE_S)
    time.sleep(p["grace"])
    result = fan_out_runs(p["members"], sent_ms, read_records(ctx.r, WF_END_KEY), read_records(ctx.r, WF_DONE_KEY))
    result["timed_out"] = timed_out
    if kind in PRODUCT_KINDS:
        for bad in result["runs"]:
            if not bad["ok"]:
                ctx.fail(f"workflow/{kind}: fan-out run {bad['run']}: {bad['why']}")
    return result


def fan_out_runs(
    members: int,
    sent_ms: list[float],
    ends: list[tuple[int, float, int]],
    starts: list[tuple[int, float, int]],
) -> dict[str, Any]:
    """Each run's figures from the records: ``ends`` (member seq, end ms, pid) and
    ``starts`` (run, completion start ms, pid). A run fails when its completion started
    other than once, a member did not run or ran twice, or the completion started before
    the last member's end. Latency and total time over the runs that completed once."""
    by_run_ends: dict[int, list[tuple[int, float]]] = {}
    for seq, end, _pid in ends:
        by_run_ends.setdefault(seq // SEQ_RUN, []).append((seq % SEQ_RUN, end))
    by_run_starts: dict[int, list[float]] = {}
    for run, start, _pid in starts:
        by_run_starts.setdefault(run, []).append(start)
    runs: list[dict[str, Any]] = []
    for run, sent in enumerate(sent_ms):
        run_ends = by_run_ends.get(run, [])
        indexes = {i for i, _ in run_ends}
        completions = sorted(by_run_starts.get(run, []))
        entry: dict[str, Any] = {
            "run": run,
            "completions": len(completions),
            "members_ran": len(indexes),
            "members_twice": len(run_ends) - len(indexes),
            "latency_ms": None,
            "total_ms": None,
        }
        why = []
        if len(completions) != 1:
            why.append(f"the completion started {len(completions)} times")
        if len(indexes) != members:
            why.append(f"{members - len(indexes)} of {members} members did not run")
        if entry["members_twice"]:
            why.append(f"{entry['members_twice']} repeated member runs")
        if completions and run_ends:
            entry["latency_ms"] = round(completions[0] - max(end for _, end in run_ends), 3)
            entry["total_ms"] = round(completions[0] - sent, 3)
            if entry["latency_ms"] < 0:
                why.append(f"the completion started {-entry['latency_ms']} ms before the last member's end")
        entry["ok"] = not why
        entry["why"] = "; ".join(why)
        runs.append(entry)
    counted = [r for r in runs if r["completions"] and r["latency_ms"] is not None]
    return {
        "runs": runs,
        "failed_runs": sum(not r["ok"] for r in runs),
        "latency_ms": pct([r["latency_ms"] for r in counted]),
        "total_ms": pct([r["total_ms"] for r in counted]),
        "completions_per_run": [r["completions"] for r in runs],
    }


def _fan_row(kind: str, fan: dict[str, Any]) -> dict[str, Any]:
    lat, total, runs = fan["latency_ms"], fan["total_ms"], fan["runs"]
    counts = sorted(set(fan["completions_per_run"]))
    return {
        "broker": kind,
        "runs": len(runs),
        "failed runs": fan["failed_runs"],
        "completions per run": "/".join(map(str, counts)),
        "members ran": sum(r["members_ran"] for r in runs),
        "members twice": sum(r["members_twice"] for r in runs),
        "p50 ms": lat["p50"],
        "p99 ms": lat["p99"],
        "max ms": lat["max"],
        "run total p50 ms": total["p50"],
        "run total max ms": total["max"],
    }


# -- 2. cost per step ---------------------------------------------------------------------


def _cost(ctx: Ctx, broker: Any, member: Any, p: dict[str, Any], w: Workers, slots: list[str]) -> dict[str, Any]:
    """The server's work per plain message and per workflow step (see the module)."""
    from dramatiq_redisson.workflows import chain

    length = int(p["chain"])
    chains = -(-int(p["cost_n"]) // length)
    n = chains * length

    def plain() -> None:
        for seq in range(n):
            member.send(seq)

    def steps() -> None:
        for c in range(chains):
            links = [member.message_with_options(args=(c * length + i,), pipe_ignore=True) for i in range(length)]
            chain(*links).run(broker=broker)

    out: dict[str, Any] = {"n": n, "chain": length}
    since_ms = ctx.server.now_ms()  # the fan-out's workflows started before
    for name, send in (("plain", plain), ("workflow", steps)):
        phase = _phase(ctx, w, slots, n, send, p)
        out[name] = phase
        if phase["ran"] != n or phase["ran_twice"]:
            ctx.fail(f"workflow/redisson: cost ({name}): {phase['ran']} of {n} ran, {phase['ran_twice']} twice")
    listed = broker.workflows.list(state="done", limit=chains + int(p["runs"]) + 1)
    finished = sum(1 for summary in listed if summary.created_ms >= since_ms)
    out["chains_done"] = finished
    if finished != chains:
        ctx.fail(f"workflow/redisson: cost: {finished} of {chains} chains done")
    plain_cost, step_cost = out["plain"], out["workflow"]
    out["extra"] = {key: round(step_cost[key] - plain_cost[key], 3) for key in _COST_COLUMNS}
    rows = [
        _cost_row("plain message (send)", plain_cost),
        _cost_row(f"workflow step (chains of {length})", step_cost),
        {"sent as": "step - plain", **{_COST_COLUMNS[k]: v for k, v in out["extra"].items()}},
    ]
    out["rows"] = rows
    return out


_COST_COLUMNS = {
    "commands_per_msg": "commands/msg",
    "script_calls_per_msg": "script calls/msg",
    "script_us_per_msg": "script us/msg",
    "server_cpu_us_per_msg": "server CPU us/msg",
    "sender_script_calls_per_msg": "sender's script calls/msg",
    "worker_fetch_per_msg": "workers' fetch/msg",
    "worker_ack_per_msg": "workers' ack/msg",
    "worker_other_per_msg": "workers' other scripts/msg",
}


def _cost_row(label: str, phase: dict[str, Any]) -> dict[str, Any]:
    return {
        "sent as": label,
        "msgs": phase["ran"],
        "seconds": phase["seconds"],
        **{column: phase[key] for key, column in _COST_COLUMNS.items()},
    }


def _phase(
    ctx: Ctx, w: Workers, slots: list[str], n: int, send: Callable[[], None], p: dict[str, Any]
) -> dict[str, Any]:
    """Send ``n`` messages with ``send``, wait until each has run (their records) and
    ``p["settle"]`` s more (the last acks), then read the server's statistics and the
    script calls the sender and the workers made, by ``_measure.SCRIPT_CATEGORIES`` (a
    workflow's step.lua, like an enqueue, is "other")."""
    ctx.r.delete(WF_END_KEY)
    sender = [0] * len(slots)
    counter = CommandCounter(slots, {}, sender)
    workers0 = w.command_counts()
    ctx.server.reset_stats()
    cpu0 = ctx.server.cpu_seconds()
    t0 = time.monotonic()
    counter.activate()
    try:
        send()
    finally:
        CommandCounter.deactivate()
    polls = 0
    deadline = time.monotonic() + p["timeout"]
    while time.monotonic() < deadline:
        polls += 1
        if int(ctx.r.llen(WF_END_KEY)) >= n:
            break
        w.check()
        time.sleep(POLL_S)
    seconds = time.monotonic() - t0
    time.sleep(p["settle"])
    cpu_s = ctx.server.cpu_seconds() - cpu0
    stats = ctx.server.commandstats()
    workers = {name: count - workers0.get(name, 0) for name, count in w.command_counts().items()}
    calls, usec = stats.get("llen", (0, 0))
    stats["llen"] = (calls - polls, usec)  # the harness's own waiting
    work = server_work(stats, n)
    totals = server_work(stats, 1)  # exact counts (per message, commands are rounded to 0.1)
    seqs = [seq for seq, _, _ in read_records(ctx.r, WF_END_KEY)]
    sender_scripts = sum(count for name, count in zip(slots, sender, strict=True) if name.startswith("script:"))
    return {
        "ran": len(set(seqs)),
        "ran_twice": len(seqs) - len(set(seqs)),
        "seconds": round(seconds, 3),
        "commands_per_msg": round(totals["commands_per_msg"] / n, 2),
        "script_calls_per_msg": round(totals["script_calls_per_msg"] / n, 3),
        "script_us_per_msg": work["script_us_per_msg"],
        "server_cpu_us_per_msg": round(cpu_s * 1e6 / n, 1),
        "sender_script_calls_per_msg": round(sender_scripts / n, 3),
        "worker_fetch_per_msg": round(workers.get("script:fetch", 0) / n, 3),
        "worker_ack_per_msg": round(workers.get("script:ack", 0) / n, 3),
        "worker_other_per_msg": round((workers.get("script:other", 0) + workers.get("script:transfer", 0)) / n, 3),
        "top_commands_per_msg": work["top_commands_per_msg"],
        "_commandstats": {name: calls for name, (calls, _) in sorted(stats.items())},
    }


# -- 3. sending a big workflow ------------------------------------------------------------


def _send(ctx: Ctx, p: dict[str, Any]) -> dict[str, Any]:
    """``.run()`` of a group of ``p["send_n"]`` against ``enqueue_many`` (see the module)."""
    from dramatiq_redisson import QueueKeys
    from dramatiq_redisson.workflows import group

    from .._base import NAMESPACE

    n = int(p["send_n"])
    ctx.server.flush()
    broker = make_broker("redisson", ctx.server.url)
    member, _ = declare_workflow(broker)
    # Warm up: scripts loaded, connections open, the queue known.
    broker.enqueue_many([member.message(-1), member.message(-2)])
    group([member.message(-1), member.message(-2)]).run(broker=broker)
    # Where run()'s time goes: its one run.lua call, the sends of its first steps; the
    # rest is the client's (compiling the tree, and one ZREM).
    spent = {"record": 0.0, "sends": 0.0}
    workflows = broker.workflows
    workflows.scripts.run = _timed(workflows.scripts.run, spent, "record")
    workflows.send_messages = _timed(workflows.send_messages, spent, "sends")
    ready = QueueKeys(NAMESPACE, QUEUE).ready
    slots = counter_slots(ctx.server.command_names())
    kept = [i for i, name in enumerate(slots) if not name.startswith("script:")]
    samples: dict[str, list[dict[str, Any]]] = {"enqueue_many": [], "run": []}
    for _ in range(p["send_repeat"]):
        for how in ("enqueue_many", "run"):
            ctx.server.flush()
            messages = [member.message(i) for i in range(n)]
            work = group(messages) if how == "run" else None
            counts = [0] * len(slots)
            counter = CommandCounter(slots, {}, counts)
            ctx.server.reset_stats()
            spent.update(record=0.0, sends=0.0)
            counter.activate()
            t0 = time.perf_counter()
            try:
                if work is not None:
                    work.run(broker=broker)
                else:
                    broker.enqueue_many(messages)
            finally:
                elapsed = time.perf_counter() - t0
                CommandCounter.deactivate()
            script_calls, script_us = ctx.server.evalsha_stats()
            queued = int(ctx.r.llen(ready))
            if queued != n:
                ctx.fail(f"workflow/redisson: send ({how}): {queued} of {n} messages queued")
            sample = {
                "ms": round(elapsed * 1000, 2),
                "commands_sent": sum(counts[i] for i in kept),
                "script_calls": script_calls,
                "script_ms": round(script_us / 1000, 2),
                "queued": queued,
            }
            if work is not None:
                sample["record_ms"] = round(spent["record"] * 1000, 2)
                sample["sends_ms"] = round(spent["sends"] * 1000, 2)
            samples[how].append(sample)
    broker.close()
    ctx.server.flush()
    medians = {how: _median_sample(found) for how, found in samples.items()}
    ratio = _ratio(medians["run"]["ms"], medians["enqueue_many"]["ms"])
    rows = [
        {
            "sent with": "broker.enqueue_many(messages)" if how == "enqueue_many" else "group(messages).run()",
            "msgs": n,
            "ms": m["ms"],
            "msgs/s": round(n / (m["ms"] / 1000)) if m["ms"] else None,
            "commands sent": m["commands_sent"],
            "script calls": m["script_calls"],
            "server script ms": m["script_ms"],
            "run.lua call ms": m.get("record_ms"),
            "first steps' sends ms": m.get("sends_ms"),
            "vs enqueue_many": _ratio(m["ms"], medians["enqueue_many"]["ms"]),
        }
        for how, m in medians.items()
    ]
    return {"n": n, "samples": samples, "median": medians, "ratio": ratio, "rows": rows}


def _timed(call: Callable[..., Any], spent: dict[str, float], name: str) -> Callable[..., Any]:
    """``call``, adding the seconds each call takes to ``spent[name]``."""

    def timed(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return call(*args, **kwargs)
        finally:
            spent[name] += time.perf_counter() - t0

    return timed


def _median_sample(found: list[dict[str, Any]]) -> dict[str, Any]:
    """The median of each figure over the repeats."""
    return {key: round(statistics.median(s[key] for s in found), 2) for key in found[0]}


# -- targets ------------------------------------------------------------------------------


def _targets(data: dict[str, Any]) -> list[dict[str, Any]]:
    targets: list[dict[str, Any]] = []
    fan = data.get("redisson", {}).get("fan_out")
    if fan is not None:
        p99 = fan["latency_ms"]["p99"]
        targets.append(
            {
                "target": f"fan-out: completion start - last member's end p99 <= {FAN_OUT_P99_MS:g} ms "
                f"({len(fan['runs'])} runs)",
                "value": p99,
                "met": p99 is not None and p99 <= FAN_OUT_P99_MS and not fan["failed_runs"],
            }
        )
    cost = data.get("cost")
    if cost is not None:
        extra = cost["extra"]
        than = "per workflow step than per plain message"
        targets += [
            {
                "target": f"cost: <= {EXTRA_COMMANDS_PER_STEP:g} server commands more {than}",
                "value": extra["commands_per_msg"],
                "met": extra["commands_per_msg"] <= EXTRA_COMMANDS_PER_STEP,
            },
            {
                "target": f"cost: <= {EXTRA_SCRIPT_CALLS_PER_STEP:g} script call more {than}",
                "value": extra["script_calls_per_msg"],
                "met": extra["script_calls_per_msg"] <= EXTRA_SCRIPT_CALLS_PER_STEP,
            },
        ]
    send = data.get("send")
    if send is not None:
        targets.append(
            {
                "target": f"send: run() of a group of {send['n']} <= {SEND_RATIO:g}x enqueue_many of as many",
                "value": send["ratio"],
                "met": send["ratio"] is not None and send["ratio"] <= SEND_RATIO,
            }
        )
    return targets
