"""``operations``: the operators' API, CLI and dashboard on a large backlog."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from .._base import HOUR_MS, QUEUE, member_message_id
from .._brokers import script_names
from .._measure import CommandCounter, classify_slowlog, counter_slots, longest_call, pct
from .._server import SLOWLOG_THRESHOLD_US
from ._shared import Ctx, _r, _top_level_usec

#: Per size: messages scheduled (and dead letters), single-message calls per operation,
#: stats() calls. (Kept here rather than in _base.SIZES: only this scenario reads them.)
OPERATIONS_SIZES: dict[str, dict[str, int]] = {
    "tiny": {"n": 2_000, "single": 100, "stats": 10, "dashboard_n": 2_000, "renders": 5},
    "small": {"n": 20_000, "single": 300, "stats": 20, "dashboard_n": 100_000, "renders": 20},
    "full": {"n": 100_000, "single": 300, "stats": 20, "dashboard_n": 1_000_000, "renders": 50},
}


DASHBOARD_PAGE_MS = 50.0  # the dashboard issue's bound on rendering a page of 50, server-side


OP_ACTORS = ("bench_op_a", "bench_op_b")


OP_LONGEST_MS = 5.0  # the bound on any single server call


def _op_actors(broker: Any) -> tuple[Any, Any]:
    """Two actors on the bench queue (never run: no workers in this scenario)."""
    import dramatiq

    def noop(seq: int) -> None:
        pass

    decorate: Any = dramatiq.actor
    a, b = (decorate(noop, broker=broker, queue_name=QUEUE, actor_name=name, max_retries=0) for name in OP_ACTORS)
    return a, b


def _op_fill(ctx: Ctx, broker: Any, actors: tuple[Any, Any], n: int, chunk: int = 1000) -> list[Any]:
    """``n`` messages scheduled 1-2 h ahead with ``enqueue_many`` (one delay per chunk,
    growing with the chunk, so the due times spread over the hour and the offer order is
    the due order), actors alternating a, b, a, … Returns the messages as enqueued."""
    ctx.server.flush()
    out: list[Any] = []
    for start in range(0, n, chunk):
        part = [actors[i % 2].message(i) for i in range(start, min(n, start + chunk))]
        out += broker.enqueue_many(part, delay=HOUR_MS + HOUR_MS * start // n)
    return out


def _op_fill_dead(ctx: Ctx, keys: Any, actor: Any, n: int, chunk: int = 5000) -> None:
    """``n`` dead letters in the built-in layout: ``.XQ`` id -> time of death, oldest
    first; ``.XQ.msgs`` id -> the encoded message (with its redis_message_id)."""
    import uuid

    died = int(ctx.server.now_ms()) - n
    for start in range(0, n, chunk):
        zset: dict[str, int] = {}
        msgs: dict[str, bytes] = {}
        for i in range(start, min(n, start + chunk)):
            rid = str(uuid.uuid4())
            zset[rid] = died + i
            msgs[rid] = actor.message_with_options(args=(i,), redis_message_id=rid).encode()
        with ctx.r.pipeline(transaction=False) as pipe:
            pipe.zadd(keys.xq, zset)
            pipe.hset(keys.xq_msgs, mapping=msgs)
            pipe.execute()


def _names_actor(data: bytes, actor: str) -> bool:
    """Whether a stored payload (JSON, or compact: the actor's name between two 0x1e) is
    one of ``actor``'s messages."""
    return f'"actor_name":"{actor}"'.encode() in data or b"\x1e" + actor.encode() + b"\x1e" in data


def _op_actor_counts(ctx: Ctx, keys: Any, members: list[bytes]) -> dict[str, int]:
    """How many of ``members`` (scheduled entries) belong to each bench actor, from their
    stored payloads (a missing payload counts as "?")."""
    counts = dict.fromkeys((*OP_ACTORS, "?"), 0)
    for start in range(0, len(members), 5000):
        part = members[start : start + 5000]
        for data in ctx.r.hmget(keys.payloads, [member_message_id(m) for m in part]):
            name = next((a for a in OP_ACTORS if data and _names_actor(data, a)), "?")
            counts[name] += 1
    return counts


def _op_measure(
    ctx: Ctx, names: dict[str, str], slots: list[str], fn: Callable[[], Any], slower_than_us: int
) -> tuple[Any, dict[str, Any]]:
    """Run ``fn`` once, measured: wall time; commands this process sent (redis-py's packer,
    pipelined or not: the server calls); their server time (INFO commandstats, commands
    run inside scripts not counted twice); the longest single call (SLOWLOG: an EVALSHA's
    entry is the whole script call)."""
    out = [0] * len(slots)
    counter = CommandCounter(slots, names, out)
    ctx.server.slowlog_on(slower_than_us=slower_than_us)
    counter.activate()
    t0 = time.perf_counter()
    try:
        result = fn()
    finally:
        wall = time.perf_counter() - t0
        CommandCounter.deactivate()
    stats = ctx.server.commandstats()
    entries, overflow = ctx.server.slowlog()
    ctx.server.slowlog_off()
    sent = {k: out[i] for i, k in enumerate(slots) if out[i] and not k.startswith("script:")}
    groups = classify_slowlog(entries, names)
    longest = longest_call(groups)
    per_script: dict[str, list[float]] = {}
    for duration, argv in entries:  # script calls only (each EVALSHA entry is one whole call)
        if argv and argv[0].upper() == b"EVALSHA" and len(argv) > 1:
            per_script.setdefault(names.get(argv[1].decode(), "?"), []).append(duration / 1000)
    pooled = [d for durations in per_script.values() for d in durations]
    return result, {
        "wall_s": wall,
        "calls": sum(sent.values()),
        "sent": sent,
        "server_us": sum(_top_level_usec(stats, sent).values()),
        "script_calls": stats.get("evalsha", (0, 0))[0] + stats.get("fcall", (0, 0))[0],
        "longest_us": longest["max_us"],
        "longest_by": longest["by"],
        "by_script": {
            k: {"calls": int(v["count"]), "max_us": int(v["max_us"])}
            for k, v in groups.items()
            if not k.startswith("(harness)")
        },
        # Durations (ms) of the logged script calls, per script: with the 100 us threshold,
        # only the calls that took longer (in bulk operations, nearly all of them).
        "script_call_ms": {k: pct(v) for k, v in per_script.items()},
        "script_call_p50_ms": pct(pooled)["p50"],
        "slowlog_threshold_us": slower_than_us,
        "slowlog_overflow": overflow,
    }


def _timed_calls(fn: Callable[[Any], Any], items: list[Any]) -> tuple[list[Any], list[float]]:
    """``fn(item)`` for every item; the results and each call's client time (ms)."""
    results, times = [], []
    for item in items:
        t0 = time.perf_counter()
        results.append(fn(item))
        times.append((time.perf_counter() - t0) * 1000)
    return results, times


class _Operations:
    """One run of the operations scenario on the redisson broker: its fills, measurements
    and checks, and the rows they make."""

    def __init__(self, ctx: Ctx, p: dict[str, Any], data: dict[str, Any]) -> None:
        self.ctx, self.p, self.data = ctx, p, data
        self.n, self.k = p["n"], p["single"]
        self.n_a, self.n_b = (self.n + 1) // 2, self.n // 2
        self.broker, _ = ctx.producer("redisson")
        self.actors = _op_actors(self.broker)
        self.keys = self.broker.keys(QUEUE)
        self.dq = self.broker.delayed_queue(QUEUE)
        self.dead = self.broker.dead_letters(QUEUE)
        self.names = script_names(self.broker)
        self.slots = counter_slots(ctx.server.command_names())
        for script in self.broker.redisson_scripts._s.values():
            ctx.r.script_load(script.script)  # no NOSCRIPT round trip inside a measurement
        self.ops: dict[str, Any] = {}
        data["redisson"] = self.ops
        self.rows: list[dict[str, Any]] = []

    def check(self, op: str, what: str, got: Any, expected: Any) -> bool:
        if got != expected:
            self.ctx.fail(f"operations/redisson: {op}: {what} {got!r}, expected {expected!r}")
            return False
        return True

    def measure(
        self, op: str, fn: Callable[[], Any], slower_than_us: int = SLOWLOG_THRESHOLD_US
    ) -> tuple[Any, dict[str, Any]]:
        self.ctx.log(f"operations/redisson: {op}")
        return _op_measure(self.ctx, self.names, self.slots, fn, slower_than_us)

    def row(self, op: str, affected: int, m: dict[str, Any], ok: bool, lat: list[float] | None = None) -> None:
        per = affected or 1
        res = {
            **m,
            "affected": affected,
            "ok": ok,
            "wall_us_per_msg": m["wall_s"] * 1e6 / per,
            "server_us_per_msg": m["server_us"] / per,
        }
        if lat is not None:
            res["client_ms"] = pct(lat)
        self.ops[op] = res
        longest_ms = m["longest_us"] / 1000
        self.rows.append(
            {
                "broker": "redisson",
                "operation": op,
                "msgs": affected,
                "wall s": round(m["wall_s"], 3),
                "server calls": m["calls"],
                "server ms": round(m["server_us"] / 1000, 1),
                "longest call ms": round(longest_ms, 3),
                "longest by": m["longest_by"],
                "call p50 ms": m["script_call_p50_ms"],
                "wall us/msg": round(res["wall_us_per_msg"], 2),
                "server us/msg": round(res["server_us_per_msg"], 2),
                "client p50 ms": res["client_ms"]["p50"] if lat is not None else None,
                "client p99 ms": res["client_ms"]["p99"] if lat is not None else None,
                "checks": "ok" if ok else "MISMATCH",
                "longest <= 5 ms": "MET" if longest_ms <= OP_LONGEST_MS else "MISSED",
            }
        )

    def scans_and_one_actors_half(self) -> None:
        """Fill 1: scans, then promote_all / remove_all of one actor's half."""
        t0 = time.monotonic()
        _op_fill(self.ctx, self.broker, self.actors, self.n)
        self.data["fill_seconds"] = round(time.monotonic() - t0, 2)
        self.ctx.log(
            f"operations/redisson: {self.n} scheduled 1-2 h ahead in {self.data['fill_seconds']} s (enqueue_many)"
        )
        self.check("fill", "scheduled", self.dq.size(), self.n)

        seen, m = self.measure("scan()", lambda: [(due, msg.message_id) for due, msg in self.dq.scan()])
        ok = self.check("scan()", "messages", len(seen), self.n)
        ok &= self.check("scan()", "distinct messages", len({mid for _, mid in seen}), self.n)
        ok &= self.check("scan()", "due order", all(a[0] <= b[0] for a, b in zip(seen, seen[1:], strict=False)), True)
        self.row("scan()", len(seen), m, ok)

        seen, m = self.measure(
            "scan(actor_name=a)", lambda: [msg.actor_name for _, msg in self.dq.scan(actor_name=OP_ACTORS[0])]
        )
        ok = self.check("scan(actor_name=a)", "messages", len(seen), self.n_a)
        ok &= self.check("scan(actor_name=a)", "other actors' messages", sum(a != OP_ACTORS[0] for a in seen), 0)
        self.row("scan(actor_name=a)", len(seen), m, ok)

        done, m = self.measure("promote_all(actor_name=a)", lambda: self.dq.promote_all(actor_name=OP_ACTORS[0]))
        now = int(self.ctx.server.now_ms())
        due_now = self.ctx.r.zrangebyscore(self.keys.timeout_zset, "-inf", now)
        ok = self.check("promote_all(actor_name=a)", "returned", done, self.n_a)
        ok &= self.check(
            "promote_all(actor_name=a)",
            "due now, by actor",
            _op_actor_counts(self.ctx, self.keys, due_now),
            {**dict.fromkeys(OP_ACTORS, 0), OP_ACTORS[0]: self.n_a, "?": 0},
        )
        self.row("promote_all(actor_name=a)", done, m, ok)

        done, m = self.measure("remove_all(actor_name=b)", lambda: self.dq.remove_all(actor_name=OP_ACTORS[1]))
        ok = self.check("remove_all(actor_name=b)", "returned", done, self.n_b)
        ok &= self.check("remove_all(actor_name=b)", "left scheduled", self.dq.size(), self.n_a)
        ok &= self.check("remove_all(actor_name=b)", "payloads left", self.ctx.r.hlen(self.keys.payloads), self.n_a)
        ok &= self.check(
            "remove_all(actor_name=b)",
            "left not yet due",
            self.ctx.r.zcount(self.keys.timeout_zset, f"({now}", "+inf"),
            0,
        )
        self.row("remove_all(actor_name=b)", done, m, ok)

    def promote_everything(self) -> None:
        """Fill 2: promote_all() of everything."""
        _op_fill(self.ctx, self.broker, self.actors, self.n)
        done, m = self.measure("promote_all()", self.dq.promote_all)
        now = int(self.ctx.server.now_ms())
        ok = self.check("promote_all()", "returned", done, self.n)
        ok &= self.check("promote_all()", "scheduled", self.dq.size(), self.n)
        ok &= self.check(
            "promote_all()", "not yet due", self.ctx.r.zcount(self.keys.timeout_zset, f"({now}", "+inf"), 0
        )
        self.row("promote_all()", done, m, ok)

    def singles_and_dead_letters(self) -> None:
        """Fill 3, with n dead letters: stats, one message's get / reschedule / promote,
        remove_all(), then the dead letters' requeue_all and clear."""
        filled = _op_fill(self.ctx, self.broker, self.actors, self.n)
        _op_fill_dead(self.ctx, self.keys, self.actors[0], self.n)

        def stats_calls() -> tuple[list[Any], list[float]]:
            return _timed_calls(lambda _: self.broker.stats(), list(range(self.p["stats"])))

        (replies, lat), m = self.measure("stats()", stats_calls, slower_than_us=0)
        got = {(r["queues"][QUEUE]["scheduled"], r["queues"][QUEUE]["dead"]) for r in replies}
        ok = self.check("stats()", "(scheduled, dead)", got, {(self.n, self.n)})
        self.row("stats()", len(replies), m, ok, lat)

        mid = filled[self.n // 2 - self.k // 2 : self.n // 2 - self.k // 2 + self.k]
        ids = [msg.message_id for msg in mid]
        (found, lat), m = self.measure("get(id)", lambda: _timed_calls(self.dq.get, ids), slower_than_us=0)
        ok = self.check(
            "get(id)",
            "found",
            sum(f is not None and f[1].message_id == i for f, i in zip(found, ids, strict=True)),
            self.k,
        )
        self.row("get(id)", self.k, m, ok, lat)

        (moved, lat), m = self.measure(
            "reschedule(id, delay=90 min)",
            lambda: _timed_calls(lambda i: self.dq.reschedule(i, delay=HOUR_MS * 3 // 2), ids),
            slower_than_us=0,
        )
        ok = self.check("reschedule(id, delay=90 min)", "rescheduled", sum(moved), self.k)
        self.row("reschedule(id, delay=90 min)", self.k, m, ok, lat)

        (promoted, lat), m = self.measure("promote(id)", lambda: _timed_calls(self.dq.promote, ids), slower_than_us=0)
        now = int(self.ctx.server.now_ms())
        with self.ctx.r.pipeline(transaction=False) as pipe:
            for msg in mid:
                pipe.zscore(self.keys.timeout_zset, msg.options["redis_message_id"])
            scores = pipe.execute()
        ok = self.check("promote(id)", "promoted", sum(promoted), self.k)
        ok &= self.check("promote(id)", "due now", sum(s is not None and s <= now for s in scores), self.k)
        self.row("promote(id)", self.k, m, ok, lat)

        done, m = self.measure("remove_all()", self.dq.remove_all)
        ok = self.check("remove_all()", "returned", done, self.n)
        ok &= self.check("remove_all()", "left scheduled", self.dq.size(), 0)
        ok &= self.check("remove_all()", "payloads left", self.ctx.r.hlen(self.keys.payloads), 0)
        self.row("remove_all()", done, m, ok)

        done, m = self.measure("dead_letters.requeue_all()", self.dead.requeue_all)
        ok = self.check("dead_letters.requeue_all()", "returned", done, self.n)
        ok &= self.check(
            "dead_letters.requeue_all()",
            "dead letters left",
            (self.dead.size(), self.ctx.r.hlen(self.keys.xq_msgs)),
            (0, 0),
        )
        ok &= self.check(
            "dead_letters.requeue_all()",
            "ready",
            (self.ctx.r.llen(self.keys.ready), self.ctx.r.hlen(self.keys.ready_msgs)),
            (self.n, self.n),
        )
        self.row("dead_letters.requeue_all()", done, m, ok)

        self.ctx.r.delete(self.keys.ready, self.keys.ready_msgs)
        _op_fill_dead(self.ctx, self.keys, self.actors[0], self.n)
        done, m = self.measure("dead_letters.clear()", self.dead.clear)
        ok = self.check("dead_letters.clear()", "returned", done, self.n)
        ok &= self.check(
            "dead_letters.clear()", "dead letters left", (self.dead.size(), self.ctx.r.hlen(self.keys.xq_msgs)), (0, 0)
        )
        ok &= self.check("dead_letters.clear()", "ready", self.ctx.r.llen(self.keys.ready), 0)
        self.row("dead_letters.clear()", done, m, ok)


def operations(ctx: Ctx) -> dict[str, Any]:
    """The operator's operations (issue 8) over a full delayed queue: scan, promote_all,
    remove_all, dead letters' requeue_all and clear, stats, and get / reschedule / promote
    of one message: wall time, server calls, longest single server call, correctness."""
    from .._internals import BULK_STEP

    p = {**OPERATIONS_SIZES[ctx.size], "bulk_step": BULK_STEP}
    data: dict[str, Any] = {"params": p}
    rows: list[dict[str, Any]] = []
    for kind in ctx.brokers:
        if kind == "builtin":
            rows.append({"broker": kind, "operation": "(none: RedisBroker has no such operations)"})
        elif kind == "redisson-lrem":
            rows.append({"broker": kind, "operation": "(not run: the same operations as redisson)"})
    if "redisson" not in ctx.brokers:
        return {"data": data, "rows": rows, "targets": []}

    run = _Operations(ctx, p, data)
    run.scans_and_one_actors_half()
    run.promote_everything()
    run.singles_and_dead_letters()
    broker, actors, ops, n = run.broker, run.actors, run.ops, run.n
    dashboard_rows, dashboard_target = _dashboard_pages(ctx, broker, actors, p)
    data["dashboard"] = dashboard_rows
    broker.close()

    rows[:0] = run.rows + dashboard_rows
    worst = max(ops, key=lambda op: ops[op]["longest_us"])
    worst_ms = ops[worst]["longest_us"] / 1000
    targets = [
        {
            "target": f"operations: every operation's longest single server call <= 5 ms at {n} scheduled",
            "value": f"{_r(worst_ms, 3)} ms ({worst}, {ops[worst]['longest_by']})",
            "met": worst_ms <= OP_LONGEST_MS,
        },
        dashboard_target,
    ]
    return {"data": data, "rows": rows, "targets": targets}


def _dashboard_pages(
    ctx: Ctx, broker: Any, actors: tuple[Any, Any], p: dict[str, Any]
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The dashboard's pages over ``dashboard_n`` scheduled (and 1 000 dead letters): each
    rendered ``renders`` times by calling the WSGI app in this process (server-side time:
    the Redis calls, decoding and the template, without HTTP), checked for status 200 and
    the rows it must show."""
    import gc
    import io
    import wsgiref.util

    from dramatiq_redisson.dashboard import make_app

    from .._internals import encode_cursor

    n, renders = p["dashboard_n"], p["renders"]
    keys = broker.keys(QUEUE)
    t0 = time.monotonic()
    filled = _op_fill(ctx, broker, actors, n, chunk=5000)
    _op_fill_dead(ctx, keys, actors[0], 1000)
    ctx.log(f"operations/dashboard: {n} scheduled in {time.monotonic() - t0:.1f} s")
    app = make_app(broker)
    middle = ctx.r.zrange(keys.timeout_zset, n // 2, n // 2, withscores=True)[0]
    cursor = encode_cursor((str(int(middle[1])).encode(), middle[0]))
    message_id = filled[n // 2].message_id
    # The harness's own million messages would make every collection of the measured
    # process (the dashboard's server) walk them: a server holds none of them.
    del filled
    gc.collect()

    def render(path: str) -> tuple[float, str]:
        path, _, query = path.partition("?")
        environ: dict[str, Any] = {}
        wsgiref.util.setup_testing_defaults(environ)
        environ.update(REQUEST_METHOD="GET", PATH_INFO=path, QUERY_STRING=query, **{"wsgi.input": io.BytesIO()})
        status: list[str] = []
        started = time.perf_counter()
        body = b"".join(app(environ, lambda s, h: status.append(s)))
        elapsed = (time.perf_counter() - started) * 1000
        if status != ["200 OK"]:
            ctx.fail(f"operations/dashboard: GET {path}?{query} answered {status}")
        return elapsed, body.decode()

    pages = [
        ("overview", "/", 0),
        ("queue: first page of 50", f"/queues/{QUEUE}?n=50", 50),
        ("queue: a page of 50 in the middle", f"/queues/{QUEUE}?n=50&after={cursor}", 50),
        ("queue: search by actor, 50", f"/queues/{QUEUE}?n=50&actor={OP_ACTORS[1]}", 50),
        ("queue: text search, no match (budget)", f"/queues/{QUEUE}?n=50&q=no-such-text", 0),
        ("message detail", f"/queues/{QUEUE}/messages/{message_id}", 0),
        ("dead letters: page of 50", f"/queues/{QUEUE}/dead?n=50", 50),
    ]
    rows: list[dict[str, Any]] = []
    worst_page_ms = 0.0
    for name, path, expect_rows in pages:
        render(path)  # first render compiles the template
        times, body = [], ""
        for _ in range(renders):
            elapsed, body = render(path)
            times.append(elapsed)
        shown = body.count("<tr data-id=")
        ok = shown == expect_rows
        if not ok:
            ctx.fail(f"operations/dashboard: {name}: {shown} rows, expected {expect_rows}")
        stats = pct(times)
        if expect_rows == 50 and name.startswith("queue:"):
            worst_page_ms = max(worst_page_ms, float(stats["p99"] or 0))
        rows.append(
            {
                "broker": "redisson",
                "operation": f"dashboard: {name}",
                "msgs": n,
                "client p50 ms": stats["p50"],
                "client p99 ms": stats["p99"],
                "checks": "ok" if ok else "MISMATCH",
            }
        )
    ctx.server.flush()
    target = {
        "target": f"dashboard: a page of 50 scheduled renders in < {DASHBOARD_PAGE_MS:.0f} ms server-side "
        f"at {n} scheduled (p99)",
        "value": f"{worst_page_ms:.1f} ms",
        "met": worst_page_ms < DASHBOARD_PAGE_MS,
    }
    return rows, target
