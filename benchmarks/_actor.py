"""The benchmark actor: records (seq, server TIME, pid) in Redis when it starts, then
optionally takes time (sleeps, or burns CPU) like a real actor."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

import dramatiq

from ._base import QUEUE
from ._measure import REC_KEY

#: One round trip: the start time is the server's clock (TIME), the same clock that
#: offer.lua uses to compute due times, so start − due needs no clock translation.
#: Sent with EVAL (not EVALSHA) so that INFO commandstats keeps its cost (cmdstat_eval)
#: apart from the brokers' scripts (cmdstat_evalsha).
RECORD_LUA = """
local t = redis.call("TIME")
redis.call("RPUSH", KEYS[1], ARGV[1] .. " " .. t[1] .. " " .. t[2] .. " " .. ARGV[2])
return 1
"""


def work_body(work: dict[str, Any] | None) -> Callable[[], None] | None:
    """What the actor does after recording its start, from ``work`` = ``{"kind": …, "ms": …}``
    (``None``: nothing, the default):

    - ``"sleep"``: ``time.sleep(ms)``, like an actor waiting on I/O: the GIL is released,
      so a process's threads all wait at once.
    - ``"cpu"``: a pure-Python busy loop until ``time.thread_time()`` (this thread's own
      CPU time) has advanced by ``ms``. The loop holds the GIL (released only at the
      interpreter's switch interval), so the threads of one process take turns: a
      process completes at most one such job per ``ms`` of CPU, however many threads it
      has. ``thread_time`` rather than ``perf_counter``: with wall time, a job sharing the
      GIL with others would end after ``ms`` having burnt only part of it, and a process
      would seem to run several CPU-bound jobs at once."""
    if not work:
        return None
    kind, seconds = work["kind"], float(work["ms"]) / 1000
    if kind == "sleep":
        return lambda: time.sleep(seconds)
    if kind == "cpu":

        def burn() -> None:
            end = time.thread_time() + seconds
            spins = 0
            while time.thread_time() < end:
                spins += 1

        return burn
    raise ValueError(f"unknown work kind {kind!r} (choose from sleep, cpu)")


def declare(broker: Any, queue: str = QUEUE, record: Any = None, work: dict[str, Any] | None = None) -> Any:
    """Declare the recording actor of ``queue`` on ``broker`` and return it: ``bench_record``
    on the bench queue, ``bench_record_<queue>`` on any other. Records go to ``record`` (a
    ``redis.Redis``), by default the broker's own client; the cluster scenario keeps them
    on the harness's single server, which its faults never touch. ``work``: what the actor
    does after recording its start (see :func:`work_body`; default nothing). A producer
    declares the same actor name without it: only the workers run the body."""
    client = broker.client if record is None else record
    body = work_body(work)

    def bench_record(seq: int) -> None:
        client.eval(RECORD_LUA, 1, REC_KEY, seq, os.getpid())
        if body is not None:
            body()

    name = "bench_record" if queue == QUEUE else f"bench_record_{queue}"
    decorate: Any = dramatiq.actor
    return decorate(bench_record, broker=broker, queue_name=queue, actor_name=name, max_retries=0)


#: Runs of the rate-limited actor that Dramatiq's rate limiter turned away (each burns a
#: retry): counted here, beside the records of the runs it let through.
REFUSED_KEY = "bench:refused"


def declare_rate_limited(broker: Any, limit: int, window_s: int, record: Any = None) -> Any:
    """``bench_record`` as a Dramatiq user limits its rate on the built-in broker today:
    the body runs inside a ``WindowRateLimiter`` (``limit`` per ``window_s`` s, on Redis),
    which raises ``RateLimitExceeded`` when the window is spent; Dramatiq's ``Retries``
    then retries the message with its default back-off. A refusal is counted in
    ``REFUSED_KEY``; a run let through records as ``bench_record`` does."""
    from dramatiq.errors import RateLimitExceeded
    from dramatiq.rate_limits import WindowRateLimiter
    from dramatiq.rate_limits.backends import RedisBackend

    client = broker.client if record is None else record
    limiter = WindowRateLimiter(RedisBackend(client=broker.client), "bench-rate", limit=limit, window=window_s)

    def bench_record(seq: int) -> None:
        with limiter.acquire(raise_on_failure=False) as acquired:
            if not acquired:
                client.incr(REFUSED_KEY)
                raise RateLimitExceeded("rate limit exceeded")  # as acquire() raises it, counted
            client.eval(RECORD_LUA, 1, REC_KEY, seq, os.getpid())

    decorate: Any = dramatiq.actor
    return decorate(bench_record, broker=broker, queue_name=QUEUE, actor_name="bench_record")


#: The list the periodic scenario's tick actor records its runs on: "name tick sec usec pid".
TICK_KEY = "bench:ticks"


def declare_periodic(broker: Any, schedules: Any, record: Any = None, queue: str = QUEUE) -> Any:
    """Declare ``bench_tick`` on ``queue`` with one schedule per ``(name, every seconds)`` of
    ``schedules`` (``@periodic(every=…, name=…)``, RedissonBroker only) and return it. Each run
    records its schedule (the message's ``periodic`` option), its tick time (its
    ``message_timestamp``) and, like ``bench_record``, the server's TIME, in ``TICK_KEY``."""
    from datetime import timedelta

    from dramatiq.middleware import CurrentMessage

    from dramatiq_redisson import periodic

    client = broker.client if record is None else record
    broker.add_middleware(CurrentMessage())

    def bench_tick() -> None:
        message: Any = CurrentMessage.get_current_message()
        tick = f"{message.options.get('periodic')} {message.message_timestamp}"
        client.eval(RECORD_LUA, 1, TICK_KEY, tick, os.getpid())

    decorate: Any = dramatiq.actor
    actor = decorate(bench_tick, broker=broker, queue_name=queue, actor_name="bench_tick", max_retries=0)
    for name, every in schedules:
        # A timedelta: every= takes one in every version measured (a bare number no longer).
        periodic(every=timedelta(seconds=every), name=name)(actor)
    return actor


#: The lists the workflow scenario's actors record on: a member's end ("seq sec usec
#: pid") and the completion step's start ("run sec usec pid"), on the server's clock.
WF_END_KEY = "bench:wf:ends"
WF_DONE_KEY = "bench:wf:done"


def declare_workflow(broker: Any, record: Any = None) -> tuple[Any, Any]:
    """Declare the workflow scenario's actors on the bench queue and return them:
    ``bench_wf_member(seq)``, a no-op that records its end in ``WF_END_KEY`` (the record
    is the last thing its body does), and ``bench_wf_done(run)``, the completion step,
    which records its start in ``WF_DONE_KEY``. On a broker that keeps no workflows
    (Dramatiq's ``RedisBroker``) it also adds Dramatiq's ``GroupCallbacks`` middleware,
    its barriers kept by ``RedisBackend`` on the broker's own server: what
    ``group(...).add_completion_callback(...)`` needs in the producer and in the workers."""
    client = broker.client if record is None else record
    if not hasattr(broker, "workflows"):
        from dramatiq.middleware import GroupCallbacks
        from dramatiq.rate_limits.backends import RedisBackend

        broker.add_middleware(GroupCallbacks(RedisBackend(client=broker.client)))

    def bench_wf_member(seq: int) -> None:
        client.eval(RECORD_LUA, 1, WF_END_KEY, seq, os.getpid())

    def bench_wf_done(run: int) -> None:
        client.eval(RECORD_LUA, 1, WF_DONE_KEY, run, os.getpid())

    decorate: Any = dramatiq.actor
    member = decorate(bench_wf_member, broker=broker, queue_name=QUEUE, actor_name="bench_wf_member", max_retries=0)
    done = decorate(bench_wf_done, broker=broker, queue_name=QUEUE, actor_name="bench_wf_done", max_retries=0)
    return member, done
