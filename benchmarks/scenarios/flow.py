"""Flow control (``max_priority``, ``broker_priority``, ``group_key``): ``fair-share``, a
second group's messages behind one group's backlog; ``priority``, high-priority messages
behind a backlog of low-priority ones.

Both send a backlog without a delay, start the workers, wait until they have begun on it,
let them run on it alone for ``settle`` s (the backlog's pace before), then send a few
"front" messages, paced, and measure for each one its wait (its start, the
server's TIME in the record, minus the server's TIME read just before its send) and how
many backlog messages started between its send and its start. Dramatiq's built-in
``RedisBroker`` has neither groups nor priorities (it ignores both options): its row shows
what a user gets today, the front messages queued behind the backlog (bounded window).

Parameters (``SIZES``, ``fair_share`` and ``priority``): ``backlog`` messages queued first,
``front`` messages sent at ``rate``/s once ``started`` backlog messages have run and
``settle`` s more have passed; ``window`` s after the last send for the front messages to
run; ``timeout`` s for the rest of the backlog (Redisson brokers: the delivery check)."""

from __future__ import annotations

import bisect
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from typing import Any

from .._actor import declare
from .._base import PRODUCT_KINDS, QUEUE
from .._brokers import make_broker
from .._measure import REC_KEY, analyze, pct, read_records, wait_records
from .._workers import Workers
from ._shared import Ctx, _r

#: Backlog messages are numbered from here (as head-of-line's far ones); front ones from 0.
BACKLOG_BASE = 1_000_000_000

#: The priority of the ``priority`` scenario's high messages (and the brokers' max_priority).
HIGH = 9


def _fill(broker: Any, kind: str, actor: Any, seqs: Sequence[int], options: dict[str, Any]) -> None:
    """Send ``seqs`` without a delay, in bulk: ``enqueue_many`` (chunks of 10 000) for the
    Redisson brokers; for the built-in broker the ``dispatch.lua`` "enqueue" call
    ``RedisBroker.enqueue`` makes, pipelined (it keeps the options, which it ignores)."""
    chunk = 10_000
    if kind != "builtin":
        for start in range(0, len(seqs), chunk):
            part = seqs[start : start + chunk]
            broker.enqueue_many([actor.message_with_options(args=(seq,), **options) for seq in part])
        return
    from dramatiq.common import current_millis

    dispatch = broker.scripts["dispatch"]
    unpack = broker._max_unpack_size()
    for start in range(0, len(seqs), chunk):
        with broker.client.pipeline(transaction=False) as pipe:
            for seq in seqs[start : start + chunk]:
                m = actor.message_with_options(args=(seq,), **options)
                m = m.copy(options={"redis_message_id": str(uuid.uuid4())})
                args = [
                    "enqueue",
                    current_millis(),
                    QUEUE,
                    broker.broker_id,
                    broker.heartbeat_timeout,
                    broker.dead_message_ttl,
                    0,
                    unpack,
                    m.options["redis_message_id"],
                    m.encode(),
                ]
                dispatch(keys=[broker.namespace], args=args, client=pipe)
            pipe.execute()


def _queue_stats(broker: Any, kind: str) -> dict[str, Any] | None:
    """The queue's ready count, ready per priority and lanes waiting (Redisson brokers)."""
    if kind == "builtin":
        return None
    q = broker.stats(QUEUE)["queues"][QUEUE]
    return {"ready": q["ready"], "ready_by_priority": q["ready_by_priority"], "lanes_waiting": q["lanes_waiting"]}


def _run(
    ctx: Ctx,
    scenario: str,
    kind: str,
    label: str,
    p: dict[str, Any],
    n_back: int,
    back_options: dict[str, Any],
    front_options: dict[str, Any],
    broker_options: dict[str, Any],
) -> dict[str, Any]:
    """One broker run: ``n_back`` backlog messages, workers, then ``p["front"]`` front
    messages at ``p["rate"]``/s. The Redisson brokers are then given ``p["timeout"]`` s
    to run everything (the delivery check covers the backlog too); the built-in broker
    only the front messages' window (``p["window"]`` s after the last send)."""
    ctx.server.flush()
    broker = make_broker(kind, ctx.server.url, **broker_options)
    actor = declare(broker)
    back = list(range(BACKLOG_BASE, BACKLOG_BASE + n_back))
    front = list(range(p["front"]))
    ctx.log(
        f"{scenario}/{label}: {n_back} queued {back_options or '(plain)'}, then {p['front']} "
        f"{front_options} at {p['rate']}/s"
    )
    t0 = time.monotonic()
    _fill(broker, kind, actor, back, back_options)
    fill_s = time.monotonic() - t0
    stats_filled = _queue_stats(broker, kind)
    sent: dict[int, float] = {}
    complete_all = None
    workers = Workers(
        kind,
        ctx.server.url,
        ctx.p["procs"],
        ctx.p["threads"],
        options={"broker": broker_options} if broker_options else None,
    )
    with workers as w:
        # Let the workers begin on the backlog (and every process start fetching).
        gate = min(p["started"], n_back)
        deadline = time.monotonic() + p["timeout"]
        while ctx.r.llen(REC_KEY) < gate and time.monotonic() < deadline:
            w.check()
            time.sleep(0.01)
        if n_back:
            time.sleep(p["settle"])  # the backlog's pace before the sends, for comparison
        started_before = ctx.r.llen(REC_KEY)
        t1 = time.monotonic()
        for seq in front:
            time.sleep(max(0.0, t1 + seq / p["rate"] - time.monotonic()))
            sent[seq] = ctx.server.now_ms()  # the server's clock, as the record's start
            actor.send_with_options(args=(seq,), **front_options)
        send_s = time.monotonic() - t1
        stats_sent = _queue_stats(broker, kind)
        complete = wait_records(ctx.r, front, time.monotonic() + p["window"], grace_s=0.0, check=w.check)
        if kind in PRODUCT_KINDS:
            complete_all = wait_records(ctx.r, front + back, time.monotonic() + p["timeout"], check=w.check)
    ctx.check_crash(scenario, kind, w)
    records = read_records(ctx.r)
    broker.close()

    res = analyze(sent, [rec for rec in records if rec[0] < BACKLOG_BASE])
    starts: dict[int, float] = {}
    for seq, start, _pid in records:
        if seq < BACKLOG_BASE:
            starts[seq] = min(start, starts.get(seq, start))
    back_starts = sorted(start for seq, start, _pid in records if seq >= BACKLOG_BASE)
    # Backlog messages that started after a front message's send and before its start.
    ahead = [
        bisect.bisect_right(back_starts, starts[seq]) - bisect.bisect_right(back_starts, sent[seq]) for seq in starts
    ]
    # The backlog's pace over the sends, and what was left of it when the last front message
    # started (0: it ran dry, and the last front messages measured nothing).
    first_send, last_send = min(sent.values()), max(sent.values())
    in_sends = bisect.bisect_right(back_starts, last_send) - bisect.bisect_right(back_starts, first_send)
    back_rate = in_sends / ((last_send - first_send) / 1000) if last_send > first_send else None
    settle_ms = p["settle"] * 1000
    before = bisect.bisect_right(back_starts, first_send) - bisect.bisect_right(back_starts, first_send - settle_ms)
    back_rate_before = before / p["settle"] if n_back and p["settle"] else None
    left = n_back - bisect.bisect_right(back_starts, max(starts.values())) if starts and n_back else None
    res.update(
        {
            "complete": complete,
            "window_s": p["window"],
            "backlog": n_back,
            "backlog_ran": len(back_starts),
            "backlog_started_before_sends": started_before,
            "backlog_left_at_last_front_start": left,
            "backlog_per_s_before_sends": round(back_rate_before) if back_rate_before else None,
            "backlog_per_s_during_sends": round(back_rate) if back_rate else None,
            "ahead": pct(ahead),
            "fill_seconds": round(fill_s, 2),
            "front_sent_per_s": round(p["front"] / send_s) if send_s else None,
            "stats_after_fill": stats_filled,
            "stats_after_sends": stats_sent,
            "_ahead_samples": ahead,
        }
    )
    if kind in PRODUCT_KINDS:
        # Delivery over the whole run, backlog included: each message once, nothing else.
        counts = Counter(seq for seq, _, _ in records)
        expected = set(front) | set(back)
        whole = {
            "lost": len(expected - counts.keys()),
            "duplicated": sum(c - 1 for seq, c in counts.items() if seq in expected),
            "unexpected": sum(c for seq, c in counts.items() if seq not in expected),
            "early": res["early"],  # a start before its send: the measurement is broken
        }
        res["whole_run"] = dict(whole, complete=complete_all)
        ctx.check_delivery(scenario, kind, whole)
        if left == 0 and n_back:
            ctx.log(f"{scenario}/{label}: the backlog ran dry before the last front message started")
    ctx.log(
        f"{scenario}/{label}: wait {res['lateness_ms']}, ahead {res['ahead']}, backlog left {left}, "
        f"stats after fill {stats_filled}, after sends {stats_sent}"
    )
    return res


def _row(label: str, res: dict[str, Any], front: str, back: str) -> dict[str, Any]:
    wait, ahead = res["lateness_ms"], res["ahead"]
    whole = res.get("whole_run", {})
    return {
        "broker": label,
        f"{back} queued": res["backlog"],
        f"{front} ran": f"{res['ran']}/{res['expected']}",
        "not run in window": res["lost"],
        "lost": whole.get("lost", "-"),
        "dup": whole.get("duplicated", res["duplicated"]),
        "wait p50 ms": wait["p50"],
        "wait p99 ms": wait["p99"],
        "wait max ms": wait["max"],
        f"{back} ahead p50": ahead["p50"],
        f"{back} ahead p90": ahead["p90"],
        f"{back} ahead p99": ahead["p99"],
        f"{back} ahead max": ahead["max"],
        f"{back}/s before": res["backlog_per_s_before_sends"],
        f"{back}/s during": res["backlog_per_s_during_sends"],
        f"{back} left": res["backlog_left_at_last_front_start"],
        "fill s": res["fill_seconds"],
    }


def _valid(res: dict[str, Any]) -> bool:
    """Every front message ran, while backlog was still waiting."""
    return bool(res["complete"]) and bool(res["backlog_left_at_last_front_start"])


def _scenario(
    ctx: Ctx,
    name: str,
    p: dict[str, Any],
    names: tuple[str, str],
    back_options: dict[str, Any],
    front_options: dict[str, Any],
    broker_options: dict[str, Any],
    ignored: str,
) -> dict[str, Any]:
    """Each broker with the backlog, then the Redisson broker's control: the same front
    messages to an empty queue. ``names``: (front, back) as the rows call them."""
    front, back = names
    data: dict[str, Any] = {"params": p}
    rows = []
    control = "redisson (control: empty queue)"
    # Immediate messages only: no transfer, so redisson-lrem would repeat redisson.
    kinds = [k for k in ctx.brokers if k != "redisson-lrem"]
    plan = [(kind, p["backlog"], kind if kind != "builtin" else f"builtin (ignores {ignored})") for kind in kinds]
    if "redisson" in kinds:
        plan.append(("redisson", 0, control))
    for kind, n_back, label in plan:
        options = {} if kind == "builtin" else broker_options
        res = _run(ctx, name, kind, label, p, n_back, back_options, front_options, options)
        data[label] = res
        rows.append(_row(label, res, front, back))
    targets = []
    ours, base = data.get("redisson"), data.get(control)
    # What Dramatiq's prefetch allows: each process holds up to its prefetch (2 x threads)
    # fetched before the front message was sent, and the other process keeps starting its
    # own while the front one waits behind them: procs x (prefetch + threads).
    bound = ctx.p["procs"] * 3 * ctx.p["threads"]
    if ours:
        ahead = ours["ahead"]["p99"]
        targets.append(
            {
                "target": f"{name}: {back} ahead of a {front} one, p99 <= procs x (prefetch + threads) ({bound})",
                "value": ahead,
                "met": ahead is not None and ahead <= bound and _valid(ours) and ours["whole_run"]["lost"] == 0,
            }
        )
    if ours and base:
        # "A few backlog messages' run time": the bound's worth of them at the pace the
        # workers ran them during the sends.
        rate = ours["backlog_per_s_during_sends"]
        budget = bound * 1000 / rate if rate else None
        mine, theirs = ours["lateness_ms"]["p99"], base["lateness_ms"]["p99"]
        limit = theirs + budget if theirs is not None and budget is not None else None
        targets.append(
            {
                "target": f"{name}: {front} p99 wait <= control p99 + {bound} {back} messages' run time",
                "value": f"{_r(mine, 1)} ms vs {_r(theirs, 1)} + {_r(budget, 1)} ms",
                "met": mine is not None and limit is not None and mine <= limit and _valid(ours),
            }
        )
    return {"data": data, "rows": rows, "targets": targets}


def fair_share(ctx: Ctx) -> dict[str, Any]:
    """``fair-share``: group "big" has a backlog; group "small" sends a few, paced
    (``max_priority`` stays 0: groups need no priorities)."""
    return _scenario(
        ctx,
        "fair-share",
        ctx.p["fair_share"],
        ("small", "big"),
        {"group_key": "big"},
        {"group_key": "small"},
        {},
        "group_key",
    )


def priority(ctx: Ctx) -> dict[str, Any]:
    """``priority``: a backlog without a priority (0, the plain ready list), then a few of
    priority 9, paced; the brokers (producer and workers) with ``max_priority=9``."""
    return _scenario(
        ctx,
        "priority",
        ctx.p["priority"],
        ("high", "low"),
        {},
        {"broker_priority": HIGH},
        {"max_priority": HIGH},
        "broker_priority",
    )


def _fetch_cost(
    ctx: Ctx, groups: int, per_group: int, fetches: int, limited: bool, weighted: bool = False
) -> dict[str, Any]:
    """Server µs per fetched message (EVALSHA time of one-message fetches, one client, no
    workers) with ``groups`` groups of ``per_group`` ready messages each, through lanes;
    ``limited``: concurrency limits and rates set (none of them binding); ``weighted``:
    every other group has weight 3."""
    ctx.server.flush()
    broker, actor = ctx.producer("redisson")
    if limited:
        broker.declare_queue(QUEUE)
        broker.limits.set(
            QUEUE, concurrency=10**9, group_concurrency=10**6, rate=10**6, group_rate=10**6, per_ms=60_000
        )
    if weighted:
        broker.declare_queue(QUEUE)
        broker.limits.set_weights(QUEUE, {f"g{g}": 3 for g in range(0, min(groups, 10_000), 2)})
    seqs = list(range(groups * per_group))
    chunk = 10_000
    for start in range(0, len(seqs), chunk):
        broker.enqueue_many(
            [actor.message_with_options(args=(s,), group_key=f"g{s % groups}") for s in seqs[start : start + chunk]]
        )
    keys = broker.keys(QUEUE)
    scripts = broker.redisson_scripts
    scripts.fetch(keys, "cost-worker", 1)  # loads the script: not timed
    r = ctx.r
    r.config_resetstat()
    began = time.perf_counter()
    taken = 0
    for _ in range(fetches):
        got = scripts.fetch(keys, "cost-worker", 1)
        taken += len(got or [])
    wall = time.perf_counter() - began
    stats = r.info("commandstats").get("cmdstat_evalsha", {})
    broker.close()
    return {
        "groups": groups,
        "queued": len(seqs),
        "limits": limited,
        "weights": weighted,
        "fetched": taken,
        "server_us_per_fetch": round(float(stats.get("usec_per_call", 0.0)), 1),
        "round_trip_us": round(wall / max(1, fetches) * 1e6, 1),
    }


def flow_cost(ctx: Ctx) -> dict[str, Any]:
    """``flow-cost``: the fetch through lanes stays flat in the number of groups and of
    queued messages (issue 35: ≤ 1.5× from 1 000 to 100 000 groups, and from 10 000 to
    1 000 000 queued), and with limits, rates and weights set. Our broker only: the
    built-in has no groups."""
    p = ctx.p["flow_cost"]
    data: dict[str, Any] = {"params": p}
    rows = []
    plan = [
        ("few groups", p["few_groups"], max(1, p["queued_low"] // p["few_groups"]), False),
        ("many groups", p["many_groups"], max(1, p["queued_low"] // p["many_groups"]), False),
        ("many queued", p["few_groups"], max(1, p["queued_high"] // p["few_groups"]), False),
        ("few groups, limits set", p["few_groups"], max(1, p["queued_low"] // p["few_groups"]), True),
        ("many groups, limits set", p["many_groups"], max(1, p["queued_low"] // p["many_groups"]), True),
        ("few groups, weights set", p["few_groups"], max(1, p["queued_low"] // p["few_groups"]), False),
    ]
    for label, groups, per_group, limited in plan:
        ctx.log(f"flow-cost/{label}: {groups} groups x {per_group}, {p['fetches']} fetches")
        res = _fetch_cost(ctx, groups, per_group, p["fetches"], limited, weighted="weights" in label)
        data[label] = res
        rows.append({"case": label, **res})
    targets = []
    # Flat: each case against the one with few groups and the same settings.
    for label, reference in (
        ("many groups", "few groups"),
        ("many queued", "few groups"),
        ("many groups, limits set", "few groups, limits set"),
    ):
        base = data[reference]["server_us_per_fetch"] or None
        value = data[label]["server_us_per_fetch"]
        ratio = round(value / base, 2) if base else None
        data[label]["ratio_to_reference"] = ratio
        targets.append(
            {
                "target": f"flow-cost: {label} / {reference} <= 1.5 (server µs per fetched message)",
                "value": ratio,
                "met": ratio is not None and ratio <= 1.5 and data[label]["fetched"] == p["fetches"],
            }
        )
    # What limits (concurrency and rates) and weights cost a fetch: reported, no target.
    base = data["few groups"]["server_us_per_fetch"] or None
    for label in ("few groups, limits set", "few groups, weights set"):
        value = data[label]["server_us_per_fetch"]
        data[label]["ratio_to_few_groups"] = round(value / base, 2) if base else None
    return {"data": data, "rows": rows, "targets": targets}


#: How much sooner than the rate window the ``rate-limit`` check's window of actor starts
#: ends (ms): see ``max_in_shorter_window``.
SPREAD_MS = 100


def _max_in_window(starts: Sequence[float], window_ms: float) -> int:
    """The most starts in any window of ``window_ms`` (a start at t counts until t + window)."""
    ordered, most, first = sorted(starts), 0, 0
    for last, t in enumerate(ordered):
        while ordered[first] <= t - window_ms:
            first += 1
        most = max(most, last - first + 1)
    return most


def _rate_run(ctx: Ctx, kind: str, p: dict[str, Any]) -> dict[str, Any]:
    """``p["n"]`` messages queued at once, run under a rate of ``p["rate"]`` per
    ``p["per_ms"]``: on our broker by ``broker.limits`` (the fetch waits), on the built-in
    one by Dramatiq's ``WindowRateLimiter`` in the actor (a refused run raises and is
    retried with Dramatiq's default back-off)."""
    from .._actor import REFUSED_KEY

    ctx.server.flush()
    rate, per_ms, n = p["rate"], p["per_ms"], p["n"]
    broker = make_broker(kind, ctx.server.url)
    actor = declare(broker)
    options: dict[str, Any] | None = None
    if kind == "builtin":
        options = {"rate_limited": (rate, per_ms // 1000)}
    else:
        broker.declare_queue(QUEUE)
        broker.limits.set(QUEUE, rate=rate, per_ms=per_ms)
    seqs = list(range(n))
    _fill(broker, kind, actor, seqs, {})
    workers = Workers(kind, ctx.server.url, ctx.p["procs"], ctx.p["threads"], options=options)
    t0 = ctx.server.now_ms()
    with workers as w:
        complete = wait_records(ctx.r, seqs, time.monotonic() + p["timeout"], grace_s=0.2, check=w.check)
    ctx.check_crash("rate-limit", kind, w)
    records = read_records(ctx.r)
    refused = int(ctx.r.get(REFUSED_KEY) or 0)
    dead = ctx.r.zcard(f"dramatiq:{QUEUE}.XQ")
    broker.close()
    starts = [start for _, start, _ in records]
    counts = Counter(seq for seq, _, _ in records)
    span = (max(starts) - min(starts)) if starts else None
    # The fastest the rate allows: n starts need ceil(n / rate) - 1 windows after the first.
    ideal = (-(-n // rate) - 1) * per_ms
    res = {
        "ran": len(counts),
        "expected": n,
        "complete": complete,
        "duplicated": sum(c - 1 for c in counts.values()),
        "max_in_window": _max_in_window(starts, per_ms) if starts else None,
        # A fetched message starts a few ms after its fetch (the thread hand-off): a window
        # of actor starts at a window's boundary can catch the tail of one fetch's batch
        # and the next. 100 ms shorter leaves that spread out.
        "max_in_shorter_window": _max_in_window(starts, per_ms - SPREAD_MS) if starts else None,
        "span_ms": round(span) if span is not None else None,
        "ideal_span_ms": ideal,
        "first_start_ms": round(min(starts) - t0) if starts else None,
        "starts_per_s": round(len(starts) / (span / 1000), 1) if span else None,
        "refused_runs": refused,
        "dead_lettered": dead,
    }
    if kind in PRODUCT_KINDS:
        ctx.check_delivery("rate-limit", kind, {"lost": n - len(counts), "duplicated": res["duplicated"]})
    ctx.log(f"rate-limit/{kind}: {res}")
    return res


def rate_limit(ctx: Ctx) -> dict[str, Any]:
    """``rate-limit``: ``n`` messages queued at once under a rate of ``rate`` per
    ``per_ms``. Ours: ``broker.limits.set(rate=…, per_ms=…)``, decided in the fetch
    (messages wait in the queue, no retry burned). Built-in: Dramatiq's
    ``WindowRateLimiter`` inside the actor, as its docs show, with the default
    ``Retries``: each refused run raises and burns a retry, and the message comes back
    after the back-off (15 s and up). Reported: runs let through, the most starts in any
    window, the span of the starts against the fastest the rate allows, refused runs
    (retries burned), dead letters, within the same ``timeout``."""
    p = ctx.p["rate_limit"]
    data: dict[str, Any] = {"params": p}
    rows = []
    kinds = [k for k in ctx.brokers if k != "redisson-lrem"]  # no delays: it would repeat redisson
    for kind in kinds:
        res = _rate_run(ctx, kind, p)
        data[kind] = res
        label = kind if kind != "builtin" else "builtin (WindowRateLimiter + Retries)"
        rows.append(
            {
                "broker": label,
                "ran in time": f"{res['ran']}/{res['expected']}",
                f"most starts in {p['per_ms']} ms (limit {p['rate']})": res["max_in_window"],
                f"most starts in {p['per_ms'] - SPREAD_MS} ms": res["max_in_shorter_window"],
                "span s": _r(res["span_ms"] / 1000 if res["span_ms"] is not None else None, 2),
                "fastest span s": res["ideal_span_ms"] / 1000,
                "starts/s": res["starts_per_s"],
                "retries burned": res["refused_runs"],
                "dead letters": res["dead_lettered"],
            }
        )
    targets = []
    ours = data.get("redisson")
    if ours:
        targets.append(
            {
                "target": "rate-limit: every message ran once, none retried, none dead",
                "value": f"{ours['ran']}/{ours['expected']}, {ours['refused_runs']} retried",
                "met": bool(ours["complete"]) and ours["duplicated"] == 0 and ours["dead_lettered"] == 0,
            }
        )
        span, ideal = ours["span_ms"], ours["ideal_span_ms"]
        targets.append(
            {
                "target": (
                    f"rate-limit: at most the rate in any {p['per_ms'] - SPREAD_MS} ms of actor starts "
                    "(the fetches it counts: tests/flow/test_rates.py), "
                    "and the rate used (span <= fastest + one window)"
                ),
                "value": f"{ours['max_in_shorter_window']} (limit {p['rate']}), span {span} vs {ideal} ms",
                "met": ours["max_in_shorter_window"] is not None
                and ours["max_in_shorter_window"] <= p["rate"]
                and span is not None
                and ideal - p["per_ms"] <= span <= ideal + p["per_ms"],
            }
        )
    return {"data": data, "rows": rows, "targets": targets}
