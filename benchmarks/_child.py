"""Entry points of the child processes (multiprocessing spawn)."""

from __future__ import annotations

import os
import time
from typing import Any


def worker_main(
    kind: str,
    url: str,
    threads: int,
    mode: str,
    ready: Any,
    stop_event: Any,
    count: Any = None,
    options: dict[str, Any] | None = None,
) -> None:
    """Run a Dramatiq Worker in this process until ``stop_event`` is set.

    mode "run": an ordinary Worker. mode "move": a Worker that moves delayed messages to
    the ready queue but never fetches from it (built-in: no consumer on the ready queue,
    only on ``.DQ``; Redisson: the ready-queue consumer gets prefetch 0, so it only runs
    its transfer timer). ``count``: (shared array, offset, slots) to count the commands
    this process sends into (see ``CommandCounter``). ``options``: ``broker`` (keyword
    arguments of the broker: ``cluster=True``, ``wait_for_replicas``…), ``queues`` (the
    queues to consume, one recording actor each; default the bench queue),
    ``record_url`` (the server the records go to; default the broker's) and ``periodic``
    (``(name, every seconds)`` pairs: a periodic actor on the bench queue with these
    schedules, see ``_actor.declare_periodic``) and ``rate_limited`` (``(limit, window
    s)``: the bench actor inside Dramatiq's ``WindowRateLimiter``, see
    ``_actor.declare_rate_limited``) and ``work`` (``{"kind": "sleep" | "cpu", "ms": …}``:
    what the recording actor does after recording its start, see ``_actor.work_body``;
    default nothing) and ``otel`` (add the tracing middleware, see ``_brokers.add_tracing``) and
    ``workflow`` (the workflow scenario's actors too, see ``_actor.declare_workflow``). Reports (pid,
    the file ``dramatiq_redisson`` is imported from) on ``ready`` once the Worker runs."""
    import redis
    from dramatiq import Worker

    from ._actor import declare
    from ._base import QUEUE, quiet_logging
    from ._brokers import add_tracing, make_broker, script_names
    from ._measure import CommandCounter
    from ._product import product_origin

    quiet_logging()
    opts = options or {}
    broker = make_broker(kind, url, **opts.get("broker", {}))
    record = redis.Redis.from_url(opts["record_url"]) if opts.get("record_url") else None
    if opts.get("otel"):
        add_tracing(broker)
    if opts.get("rate_limited"):
        from ._actor import declare_rate_limited

        declare_rate_limited(broker, *opts["rate_limited"], record)
    else:
        for queue in opts.get("queues") or [QUEUE]:
            declare(broker, queue, record, work=opts.get("work"))
    if opts.get("periodic"):
        from ._actor import declare_periodic

        declare_periodic(broker, opts["periodic"], record)
    if opts.get("workflow"):
        from ._actor import declare_workflow

        declare_workflow(broker, record)
    if count is not None:
        counts, base, slots = count
        CommandCounter(slots, script_names(broker), counts, base).activate()

    class MoverWorker(Worker):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            if kind != "builtin":
                self.queue_prefetch = 0

        def _add_consumer(self, queue_name: str, *, delay: bool = False) -> None:
            if kind == "builtin" and not delay:
                return
            super()._add_consumer(queue_name, delay=delay)

    from . import _stages

    tracer = _stages.StageTracer(broker) if _stages.enabled() and kind != "builtin" else None
    if tracer is not None:
        tracer.install()
    cls = Worker if mode == "run" else MoverWorker
    worker = cls(broker, worker_threads=threads, worker_timeout=1000)
    worker.start()
    ready.put((os.getpid(), product_origin()))
    stop_event.wait()
    worker.stop(timeout=20_000)
    if tracer is not None:
        tracer.flush(record or broker.client)
    broker.close()
    if record is not None:
        record.close()


def offer_main(kind: str, url: str, mode: str, n: int, out: Any) -> None:
    """One producer process: offer ``n`` delayed messages (1 h) and report the rate.

    mode "one": ``actor.send_with_options(delay=…)`` one by one.
    mode "keyed": the same with a distinct ``dedupe_key`` per message ("keep"): what the
    dedupe-key index costs a send that goes through.
    mode "bulk": ``broker.enqueue_many(messages, delay=…)`` (messages built beforehand;
    the rate with message construction included is reported too)."""
    from ._actor import declare
    from ._base import HOUR_MS, quiet_logging
    from ._brokers import make_broker

    quiet_logging()
    broker = make_broker(kind, url)
    actor = declare(broker)
    actor.send_with_options(args=(-1,), delay=HOUR_MS)  # warm-up: scripts loaded, connection open
    if mode == "one":
        t0 = time.perf_counter()
        for seq in range(n):
            actor.send_with_options(args=(seq,), delay=HOUR_MS)
        elapsed = time.perf_counter() - t0
        out.put({"n": n, "seconds": elapsed, "rate": n / elapsed})
    elif mode == "keyed":
        t0 = time.perf_counter()
        for seq in range(n):
            actor.send_with_options(args=(seq,), delay=HOUR_MS, dedupe_key=f"key:{seq}")
        elapsed = time.perf_counter() - t0
        out.put({"n": n, "seconds": elapsed, "rate": n / elapsed})
    else:
        t0 = time.perf_counter()
        messages = [actor.message(seq) for seq in range(n)]
        t1 = time.perf_counter()
        broker.enqueue_many(messages, delay=HOUR_MS)
        t2 = time.perf_counter()
        out.put({"n": n, "seconds": t2 - t1, "rate": n / (t2 - t1), "rate_incl_build": n / (t2 - t0)})
    broker.close()
