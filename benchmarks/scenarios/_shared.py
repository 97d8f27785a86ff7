"""What the scenarios share: the context they run in and the helpers that build their rows."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from .._actor import declare
from .._base import PRODUCT_KINDS, QUEUE
from .._brokers import add_tracing, bulk_offer, due_of, make_broker, script_names
from .._measure import classify_slowlog, longest_call
from .._server import Server
from .._workers import Workers


class Ctx:
    def __init__(
        self, server: Server, size: str, params: dict[str, Any], brokers: list[str], log: Callable[[str], None]
    ) -> None:
        self.server, self.size, self.p, self.brokers, self.log = server, size, params, brokers, log
        self.failures: list[str] = []

    @property
    def r(self) -> Any:
        return self.server.r

    def fail(self, msg: str) -> None:
        self.log("FAILURE: " + msg)
        self.failures.append(msg)

    def producer(self, kind: str, *, otel: bool = False) -> tuple[Any, Any]:
        """A producer's broker and the bench actor; ``otel``: with the tracing middleware
        (see ``_brokers.add_tracing``; ``broker.bench_otel`` says whether it was added)."""
        broker = make_broker(kind, self.server.url)
        broker.bench_otel = add_tracing(broker) if otel else False
        return broker, declare(broker)

    def workers(self, kind: str, mode: str = "run", *, otel: bool = False) -> Workers:
        options = {"otel": True} if otel else None
        return Workers(kind, self.server.url, self.p["procs"], self.p["threads"], mode, options=options)

    def check_delivery(self, scenario: str, kind: str, res: dict[str, Any], complete_required: bool = True) -> None:
        if kind in PRODUCT_KINDS:
            if res.get("duplicated"):
                self.fail(f"{scenario}/{kind}: {res['duplicated']} duplicated messages")
            if complete_required and res.get("lost"):
                self.fail(f"{scenario}/{kind}: {res['lost']} lost messages")
            if res.get("unexpected"):
                self.fail(f"{scenario}/{kind}: {res['unexpected']} messages that should not have run ran")
            if res.get("early"):
                self.fail(f"{scenario}/{kind}: {res['early']} messages started before their due time")

    def check_crash(self, scenario: str, kind: str, workers: Workers) -> None:
        for msg in workers.crashed:
            self.fail(f"{scenario}/{kind}: {msg}")


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return round(a / b, 4)


def _r(x: float | None, digits: int = 0) -> float | int | None:
    """``x`` rounded for a target's text."""
    if x is None:
        return None
    return round(x, digits) if digits else round(x)


def _lat_row(kind: str, res: dict[str, Any], **extra: Any) -> dict[str, Any]:
    lat = res["lateness_ms"]
    row = {
        "broker": kind,
        "ran": f"{res['ran']}/{res['expected']}",
        "lost": res["lost"],
        "dup": res["duplicated"],
        "p50 ms": lat["p50"],
        "p90 ms": lat["p90"],
        "p99 ms": lat["p99"],
        "max ms": lat["max"],
    }
    row.update(extra)
    return row


def _add_ratio_rows(rows: list[dict[str, Any]], data: dict[str, Any], key: str = "lateness_ms") -> None:
    base = data.get("builtin")
    if not base:
        return
    for row in rows:
        kind = row["broker"]
        if kind == "builtin" or kind not in data:
            continue
        mine = data[kind][key]
        row["p99 vs builtin"] = _ratio(mine["p99"], base[key]["p99"])
        row["p50 vs builtin"] = _ratio(mine["p50"], base[key]["p50"])


def send_paced(
    broker: Any, kind: str, actor: Any, p: dict[str, Any], rng: Any, dues: dict[int, float], pace: float | None
) -> float:
    """Send ``p["n"]`` messages ``bench_record(seq)``, ``pace`` a second (None: as fast as one
    producer goes): without a delay when ``p["immediate"]`` ("due" is the send time, taken
    just before ``send()``: the server runs on this host, so its ``TIME`` reads this
    clock), else with a delay from ``rng`` between ``p["delay_lo"]`` and ``p["delay_hi"]``
    ms (due: see ``due_of``). Fills ``dues`` (seq -> due ms) and returns the seconds it took."""
    immediate = bool(p.get("immediate"))
    t0 = time.monotonic()
    for seq in range(p["n"]):
        if pace:
            time.sleep(max(0.0, t0 + seq / pace - time.monotonic()))
        if immediate:
            dues[seq] = time.time() * 1000
            actor.send(seq)
            continue
        m = actor.send_with_options(args=(seq,), delay=rng.randint(p["delay_lo"], p["delay_hi"]))
        dues[seq] = due_of(broker, kind, m)
    return time.monotonic() - t0


def _offer_due(
    ctx: Ctx, broker: Any, kind: str, actor: Any, seqs: list[int], delay: int, variant: str = "enqueue_many"
) -> tuple[dict[int, float], float]:
    """Offer ``seqs`` due in ``delay`` ms, all at once. Returns (seq -> due ms, seconds)."""
    t0 = time.monotonic()
    if variant == "same_ms":
        # One absolute due time for all: offer.lua's "abs" mode (the legacy-migration path).
        keys = broker.keys(QUEUE)
        due_abs = int(ctx.server.now_ms()) + delay
        messages = [actor.message(seq) for seq in seqs]
        t0 = time.monotonic()
        with broker.client.pipeline(transaction=False) as pipe:
            for start in range(0, len(messages), 500):
                entries = []
                for m in messages[start : start + 500]:
                    prepared, sort_key = broker.prepare_scheduled(m)
                    entries.append((due_abs, sort_key, prepared.message_id, prepared.encode(), ""))
                broker.redisson_scripts.offer(keys, entries, absolute=True, client=pipe)
            pipe.execute()
        dues = {seq: float(due_abs) for seq in seqs}
    elif kind == "builtin":
        # The dispatch.lua "enqueue" call RedisBroker.enqueue makes, pipelined, one eta.
        dues = bulk_offer(broker, kind, actor, seqs, delay, chunk=len(seqs), read_dues=True, server=ctx.server)
    else:
        dues = bulk_offer(broker, kind, actor, seqs, delay, chunk=len(seqs), read_dues=True, server=ctx.server)
    return dues, time.monotonic() - t0


def _move_measure(
    ctx: Ctx,
    broker: Any,
    kind: str,
    actor: Any,
    seqs: list[int],
    delay: int,
    timeout: float,
    variant: str = "enqueue_many",
) -> dict[str, Any]:
    """With mover workers running: offer ``seqs`` due at once, wait until all are in the
    ready list; server script time (EVALSHA commandstats), longest call (slowlog)."""
    names = script_names(broker)
    ready = f"dramatiq:{QUEUE}"
    base_len = ctx.r.llen(ready)
    n = len(seqs)
    ctx.server.slowlog_on()
    dues, offer_s = _offer_due(ctx, broker, kind, actor, seqs, delay, variant)
    offered_at = ctx.server.now_ms()
    min_due, max_due = min(dues.values()), max(dues.values())
    ctx.server.reset_stats()  # count the moving only, not the offers
    deadline = time.monotonic() + max(0.0, (max_due - ctx.server.now_ms()) / 1000) + timeout
    t_first = t_done = None
    while time.monotonic() < deadline:
        length = ctx.r.llen(ready) - base_len
        now = ctx.server.now_ms()
        if length and t_first is None:
            t_first = now
        if length >= n:
            t_done = now
            break
        time.sleep(0.005)
    moved = ctx.r.llen(ready) - base_len
    calls, usec = ctx.server.evalsha_stats()
    entries, overflow = ctx.server.slowlog()
    ctx.server.slowlog_off()
    groups = classify_slowlog(entries, names)
    longest = longest_call(groups)
    return {
        "n": n,
        "offer_seconds": round(offer_s, 3),
        "distinct_due_ms": len(set(dues.values())),
        "due_spread_ms": round(max_due - min_due, 1),
        "offer_overlapped_due": offered_at >= min_due,
        "moved": moved,
        "all_moved": t_done is not None,
        "move_all_after_last_due_ms": round(t_done - max_due, 1) if t_done else None,
        "move_all_after_first_due_ms": round(t_done - min_due, 1) if t_done else None,
        "first_moved_after_due_ms": round(t_first - min_due, 1) if t_first else None,
        "script_calls": calls,
        "script_ms_total": round(usec / 1000, 2),
        "script_us_per_moved": round(usec / moved, 3) if moved > 0 else None,
        "longest_call_ms": round(longest["max_us"] / 1000, 3),
        "longest_call_by": longest["by"],
        "long_calls": {
            k: {"over_1ms": v["over_1ms"], "over_5ms": v["over_5ms"], "max_us": v["max_us"]}
            for k, v in groups.items()
            if not k.startswith("(harness)") and v["over_1ms"]
        },
        "slowlog_overflow": overflow,
    }


def _top_level_usec(stats: dict[str, tuple[int, int]], sent: dict[str, int]) -> dict[str, float]:
    """Server time of the commands clients sent, per command: Valkey counts a command a
    script runs under its own name too (and in the script's EVALSHA), so a command's
    usec is shared out by the fraction of its calls the clients sent themselves (counted
    client-side): EVALSHA counts whole, a command only scripts run counts nothing. The
    recorder's EVAL and the harness's own commands (not counted) are left out."""
    out: dict[str, float] = {}
    for name, (calls, usec) in stats.items():
        if name == "eval" or not calls:
            continue
        share = min(1.0, sent.get(name, 0) / calls)
        if share:
            out[name] = usec * share
    return out
