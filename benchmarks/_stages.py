"""Which step of a delayed message's way was late: ``python -m benchmarks lateness-paced --stages``.

With ``--stages`` (the environment variable ``BENCH_STAGES=1``, which the worker processes
inherit), every RedissonBroker worker process notes, per message, two local times on the
way from its due time to its start (the server runs on this host: ``time.time()`` and the
server's ``TIME`` read the same clock):

- **call**: the script call that brought it started (the transfer's or the fetch's);
- **cached**: the consumer got the message: a transfer handed it off (``hand``), or a fetch
  brought it (``fetch``);
- **returned**: the consumer's ``__next__`` gave it to Dramatiq's consumer thread;

and, per transfer call, how late the server moved each due message (transfer.lua's own
lateness, ms) and how long the call took. The run's records then split each message's
lateness into **due → call** (the timer, or the wake-up, and the consumer thread busy
elsewhere when it came due), **call → cached** (the script call), **cached → returned**
(the consumer thread busy elsewhere: acks, upkeep, the GIL) and **returned → start**
(Dramatiq's work queue: a free worker thread, the GIL), and the report names the step
that took longest for the latest messages.

The hooks wrap the product's methods by name, so an older tree measured with
``--product`` is traced too where its names allow (``take`` was ``_cache`` before the
consumer's split). Tracing costs a few µs per message in the consumer thread: compare
traced runs with traced runs.
"""

from __future__ import annotations

import os
import statistics
import threading
import time
from typing import Any

#: The list the worker processes push their stage records on (one entry per message or
#: transfer call): ``m <seq> <src> <call s> <cached s> <returned s> <pid>`` and
#: ``t <start s> <end s> <lateness ms,...>``.
STAGES_KEY = "bench:stages"

ENV = "BENCH_STAGES"


def enabled() -> bool:
    return os.environ.get(ENV) == "1"


class StageTracer:
    """The hooks of one worker process (see the module)."""

    def __init__(self, broker: Any) -> None:
        self.broker = broker
        self.lock = threading.Lock()
        self.cached: dict[str, tuple[str, float]] = {}
        self.records: list[str] = []
        self.source = threading.local()

    def install(self) -> None:
        from ._internals import RedissonConsumer

        consumer_class: Any = RedissonConsumer
        tracer = self
        cache_name = "take" if hasattr(consumer_class, "take") else "_cache"
        original_cache = getattr(consumer_class, cache_name)
        original_next = consumer_class.__next__
        original_fetch = consumer_class._fetch

        def cache(consumer: Any, fetched: list[tuple[str, Any]]) -> Any:
            now = time.time()
            src = getattr(tracer.source, "name", "hand")
            called = getattr(tracer.source, "called", now)
            with tracer.lock:
                for redis_id, _ in fetched:
                    tracer.cached[redis_id] = (src, called, now)
            return original_cache(consumer, fetched)

        def fetch(consumer: Any, count: int, **options: Any) -> Any:
            tracer.source.name = "fetch"
            tracer.source.called = time.time()
            try:
                return original_fetch(consumer, count, **options)
            finally:
                tracer.source.name = "hand"

        def next_(consumer: Any) -> Any:
            proxy = original_next(consumer)
            if proxy is not None:
                now = time.time()
                redis_id = proxy.options.get("redis_message_id")
                with tracer.lock:
                    src, called, at = tracer.cached.pop(redis_id, ("?", now, now))
                    seq = proxy.args[0] if proxy.args else -1
                    tracer.records.append(f"m {seq} {src} {called:.6f} {at:.6f} {now:.6f} {os.getpid()}")
            return proxy

        setattr(consumer_class, cache_name, cache)
        consumer_class._fetch = fetch
        consumer_class.__next__ = next_

        scripts = self.broker.redisson_scripts
        original_transfer = scripts.transfer

        def transfer(*args: Any, **kwargs: Any) -> Any:
            t0 = time.time()
            tracer.source.called = t0
            result = original_transfer(*args, **kwargs)
            t1 = time.time()
            late = getattr(result, "lateness_ms", None) or []
            if late:
                with tracer.lock:
                    tracer.records.append(f"t {t0:.6f} {t1:.6f} {','.join(str(int(x)) for x in late)}")
            return result

        scripts.transfer = transfer

    def flush(self, client: Any) -> None:
        with self.lock:
            records, self.records = self.records, []
        for i in range(0, len(records), 1000):
            client.rpush(STAGES_KEY, *records[i : i + 1000])


def analyze_stages(r: Any, dues: dict[int, float], starts: dict[int, float]) -> dict[str, Any]:
    """Per stage: p50/p99/max (ms); the transfer calls' server-side lateness and wall time;
    and, over the latest 1 % of messages, each stage's mean and which stage was the longest."""
    messages: dict[int, tuple[str, float, float, float]] = {}
    moved_late: list[float] = []
    call_ms: list[float] = []
    for raw in r.lrange(STAGES_KEY, 0, -1):
        parts = raw.decode().split()
        if parts[0] == "m":
            seq = int(parts[1])
            if seq in dues and seq not in messages:
                messages[seq] = (parts[2], float(parts[3]) * 1000, float(parts[4]) * 1000, float(parts[5]) * 1000)
        elif parts[0] == "t":
            call_ms.append((float(parts[2]) - float(parts[1])) * 1000)
            moved_late += [float(x) for x in parts[3].split(",") if x]
    rows: list[tuple[Any, ...]] = []
    for seq, (src, called, cached, returned) in messages.items():
        if seq not in starts:
            continue
        total = starts[seq] - dues[seq]
        due = dues[seq]
        rows.append((seq, total, called - due, cached - called, returned - cached, starts[seq] - returned, src))
    if not rows:
        return {}

    def pct(values: list[float]) -> dict[str, float | None]:
        if not values:
            return {"p50": None, "p99": None, "max": None}
        s = sorted(values)
        return {
            "p50": round(s[len(s) // 2], 2),
            "p99": round(s[min(len(s) - 1, int(0.99 * len(s)))], 2),
            "max": round(s[-1], 2),
        }

    names = ("due->call", "call->cached", "cached->returned", "returned->start")
    out: dict[str, Any] = {"traced": len(rows), "moved late (server, ms)": pct(moved_late)}
    out["transfer call ms"] = pct(call_ms)
    for i, name in enumerate(names):
        out[name] = pct([row[2 + i] for row in rows])
    out["total"] = pct([row[1] for row in rows])
    out["handed off"] = sum(1 for row in rows if row[-1] == "hand")
    out["fetched"] = sum(1 for row in rows if row[-1] == "fetch")
    tail = sorted(rows, key=lambda row: -row[1])[: max(1, len(rows) // 100)]
    out["latest 1%"] = {
        "n": len(tail),
        "total mean ms": round(statistics.mean(row[1] for row in tail), 2),
        **{f"{name} mean ms": round(statistics.mean(row[2 + i] for row in tail), 2) for i, name in enumerate(names)},
        "longest step": {
            name: sum(1 for row in tail if max(range(len(names)), key=lambda j: row[2 + j]) == i)
            for i, name in enumerate(names)
        },
        "handed off": sum(1 for row in tail if row[-1] == "hand"),
    }
    return out
