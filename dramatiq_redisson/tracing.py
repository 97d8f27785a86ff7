"""OpenTelemetry traces across the scheduled wait (issue 49): from the code that sends a
message to the actor that runs it, through delays, retries with back-off, dedupe keys,
lanes, shards, dead letters and periodic ticks.

Add the middleware to the broker, in producers and workers alike::

    from dramatiq_redisson.tracing import OpenTelemetry

    broker.add_middleware(OpenTelemetry())

It needs only ``opentelemetry-api`` (the ``otel`` extra). Without an SDK configured every
call it makes is one of the API's no-ops, and it writes nothing into the messages. With
one it records:

- ``send <queue>`` (PRODUCER) for each send, ``enqueue_many`` included, from the
  ``before_enqueue`` hook to ``after_enqueue``. It writes the W3C trace context of that
  span into the message's ``trace_context`` option (what the configured propagator
  writes: ``traceparent``, ``tracestate``, ``baggage``) and the send and due times
  (epoch ms, the producer's clock) into ``trace_times``. Options are stored with the
  message, so they survive every step the broker takes with it: the delayed queue and
  the transfer, retries, dedupe keys, priorities and group lanes, shards, dead letters
  and their requeue.
- ``wait <queue>`` (INTERNAL) for a message that was scheduled (a delay, a retry's
  back-off): from its send to the start of its run, with an event at its due time, so
  that a trace view shows the wait as a bar.
- ``process <queue>`` (CONSUMER) for each run, whose parent is the send's span; it
  ends when the run ends and says how the run went (``dramatiq_redisson.outcome``:
  ``success``, ``retry``, ``failed`` (a dead letter), ``error`` (raised, not retried),
  ``skipped``), with the attempt number and how long the message waited.
- With ``server_spans=True``: a CLIENT span for each of the broker's own server calls
  (offer, transfer, fetch, ack…), to see where time goes.

A periodic tick is scheduled by the server, never sent by a process: its run starts a
trace of its own, with a link to its schedule.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from contextvars import Token
from dataclasses import dataclass
from typing import Any

from dramatiq import Middleware
from dramatiq.broker import Broker, MessageProxy
from dramatiq.common import q_name
from dramatiq.logging import get_logger
from dramatiq.message import Message

from ._errors import needs_extra
from ._message import validate_delay
from ._queue_names import base_queue

try:
    from opentelemetry import context as otel_context
    from opentelemetry import trace
    from opentelemetry.propagate import get_global_textmap
    from opentelemetry.propagators.textmap import TextMapPropagator
    from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags
except ImportError as e:  # pragma: no cover - the message is the point
    raise ImportError(
        f"dramatiq_redisson.tracing needs the OpenTelemetry API: {needs_extra('otel')} "
        "(or pip install 'opentelemetry-api>=1.20,<2')"
    ) from e

__all__ = ["CONTEXT_OPTION", "TIMES_OPTION", "OpenTelemetry", "TraceIdFilter", "schedule_link"]

#: The message option that carries the W3C trace context of the send (a dict of the
#: propagator's fields: ``traceparent``, ``tracestate``, ``baggage``).
CONTEXT_OPTION = "trace_context"
#: The message option that carries ``{"sent": ms, "due": ms}``: when it was sent and when
#: it was due, epoch milliseconds on the producer's clock.
TIMES_OPTION = "trace_times"

#: The broker's script calls that ``server_spans=True`` traces.
SERVER_CALLS = ("offer", "offer_one", "offer_calls", "enqueue", "enqueue_bulk", "transfer", "fetch", "ack", "nack")

_INVALID_TRACE_ID = "0" * 32
_INVALID_SPAN_ID = "0" * 16


def _queue(name: str) -> str:
    """The queue a message belongs to: without Dramatiq's ``.DQ``/``.XQ`` suffix and
    without a shard's suffix."""
    return base_queue(q_name(name))


@functools.lru_cache(maxsize=1024)
def schedule_link(schedule: str) -> Link:
    """The link each tick of periodic schedule ``schedule`` carries: to a span context
    derived from the schedule's name (the same for every tick, on every host), so that a
    trace backend that indexes links finds all the ticks of a schedule."""
    digest = hashlib.sha256(f"dramatiq_redisson schedule {schedule}".encode()).digest()
    context = SpanContext(
        trace_id=int.from_bytes(digest[:16], "big") or 1,
        span_id=int.from_bytes(digest[16:24], "big") or 1,
        is_remote=True,
        trace_flags=TraceFlags(TraceFlags.SAMPLED),
    )
    return Link(context, {"dramatiq_redisson.periodic": schedule})


@dataclass
class _Run:
    """One message being processed (or processed, waiting for its ack or nack)."""

    message_id: str
    span: trace.Span
    context: otel_context.Context
    token: Token[otel_context.Context] | None = None
    end_ns: int | None = None
    error: bool = False
    skipped: bool = False
    retried: bool = False


class OpenTelemetry(Middleware):
    """Traces from send to run across the scheduled wait (see the module's documentation).

    Parameters:
      tracer_provider: The provider to trace with; by default OpenTelemetry's global one
        (``opentelemetry.trace.set_tracer_provider``), looked up when spans are made, so
        it may be configured after the broker.
      propagator: How the context is written into and read from messages; by default the
        global one (``opentelemetry.propagate``: W3C trace context and baggage).
      wait_spans: Record a ``wait <queue>`` span for each scheduled message (default on).
      server_spans: Record a span for each of the broker's own server calls (offer,
        transfer, fetch, ack…; default off: one more span per call, and idle workers
        fetch once per ``worker_timeout``).

    Add it last, or anywhere: its ``after_*`` hooks find the retry of a message whatever
    the order of ``Retries``, and the outcome of a run is read at its ack or nack.
    """

    def __init__(
        self,
        *,
        tracer_provider: trace.TracerProvider | None = None,
        propagator: TextMapPropagator | None = None,
        wait_spans: bool = True,
        server_spans: bool = False,
    ) -> None:
        self.tracer = trace.get_tracer(__name__, tracer_provider=tracer_provider)
        self.propagator = propagator
        self.wait_spans = wait_spans
        self.server_spans = server_spans
        self.logger = get_logger(__name__, type(self))
        self._local = threading.local()
        #: Sends between before_enqueue and after_enqueue, by id() of the message.
        self._sends: dict[int, weakref.finalize[Any, Any]] = {}
        #: Runs from before_process_message until their ack or nack, by id() of the proxy.
        self._runs: dict[int, _Run] = {}
        self._instrumented: weakref.WeakSet[Any] = weakref.WeakSet()

    # -- context in and out of messages ------------------------------------------------

    def _inject(self, carrier: dict[str, str], context: otel_context.Context) -> None:
        (self.propagator or get_global_textmap()).inject(carrier, context=context)

    def _extract(self, carrier: object) -> otel_context.Context:
        """The sender's context from a message's option; an empty context (a new trace)
        when there is none: never the thread's ambient context."""
        empty = otel_context.Context()
        if not isinstance(carrier, dict) or not carrier:
            return empty
        return (self.propagator or get_global_textmap()).extract(carrier, context=empty)

    # -- sending -----------------------------------------------------------------------

    def before_enqueue(self, broker: Broker, message: Message[Any], delay: int | None) -> None:
        if self.server_spans:
            self._instrument(broker)
        running: _Run | None = getattr(self._local, "running", None)
        retry = running is not None and running.message_id == message.message_id
        parent = running.context if retry and running is not None else otel_context.get_current()
        queue = _queue(message.queue_name)
        span = self.tracer.start_span(f"send {queue}", context=parent, kind=SpanKind.PRODUCER)
        span_context = span.get_span_context()
        if not span_context.is_valid:
            return  # no SDK and no trace to continue: nothing to write
        carrier: dict[str, str] = {}
        self._inject(carrier, trace.set_span_in_context(span, parent))
        options = message.options
        options[CONTEXT_OPTION] = carrier
        if not span.is_recording():
            return  # a trace to pass on, nothing to record
        if retry and running is not None:
            running.retried = True
        sent = time.time_ns() // 1_000_000
        delay_ms = _delay_ms(delay, options.get("eta"), sent)
        due = sent + delay_ms
        options[TIMES_OPTION] = {"sent": sent, "due": due}
        attributes: dict[str, Any] = {
            "messaging.system": "dramatiq",
            "messaging.operation.type": "send",
            "messaging.operation.name": "send",
            "messaging.destination.name": queue,
            "messaging.message.id": message.message_id,
            "dramatiq_redisson.actor": message.actor_name,
            "dramatiq_redisson.delay_ms": delay_ms,
            "dramatiq_redisson.due_time": due,
            "dramatiq_redisson.attempt": int(options.get("retries") or 0) + 1,
        }
        if retry:
            attributes["dramatiq_redisson.retry"] = True
        for option in ("dedupe_key", "dedupe", "broker_priority", "group_key", "periodic"):
            value = options.get(option)
            if isinstance(value, str | int) and not isinstance(value, bool):
                attributes[f"dramatiq_redisson.{option}"] = value
        span.set_attributes(attributes)
        key = id(message)
        finalizer = weakref.finalize(message, self._abandon, key, span)
        finalizer.atexit = False
        self._sends[key] = finalizer
        self._local.sending = span

    def after_enqueue(self, broker: Broker, message: Message[Any], delay: int | None) -> None:
        finalizer = self._sends.pop(id(message), None)
        if finalizer is None:
            return
        detached = finalizer.detach()
        if detached is None:
            return
        span = detached[2][1]
        eta = message.options.get("eta")
        if isinstance(eta, int):
            # The due time the server stored (its clock), as the broker hands it back.
            span.set_attribute("dramatiq_redisson.due_time", eta)
        span.set_attribute("dramatiq_redisson.enqueued", True)
        self._end_send(span)

    def _abandon(self, key: int, span: trace.Span) -> None:
        """A send that never reached ``after_enqueue``: it raised, or its dedupe key kept it
        out (nothing written; the caller got the message holding the key)."""
        self._sends.pop(key, None)
        span.set_attribute("dramatiq_redisson.enqueued", False)
        self._end_send(span)

    def _end_send(self, span: trace.Span) -> None:
        if getattr(self._local, "sending", None) is span:
            self._local.sending = None
        span.end()

    # -- running -----------------------------------------------------------------------

    def before_process_message(self, broker: Broker, message: MessageProxy) -> None:
        if self.server_spans:
            self._instrument(broker)
        start_ns = time.time_ns()
        options = message.options
        parent = self._extract(options.get(CONTEXT_OPTION))
        schedule = options.get("periodic")
        links = [schedule_link(schedule)] if isinstance(schedule, str) else None
        queue = _queue(message.queue_name)
        span = self.tracer.start_span(
            f"process {queue}", context=parent, kind=SpanKind.CONSUMER, links=links, start_time=start_ns
        )
        if not span.get_span_context().is_valid:
            self._local.running = None
            return
        context = trace.set_span_in_context(span, parent)
        run = _Run(message.message_id, span, context, token=otel_context.attach(context))
        self._runs[id(message)] = run
        self._local.running = run
        if span.is_recording():
            self._describe_run(span, message, queue, parent, start_ns)

    def _describe_run(
        self, span: trace.Span, message: MessageProxy, queue: str, parent: otel_context.Context, start_ns: int
    ) -> None:
        """The run's attributes, and the ``wait`` span of a scheduled message."""
        options = message.options
        attributes: dict[str, Any] = {
            "messaging.system": "dramatiq",
            "messaging.operation.type": "process",
            "messaging.operation.name": "process",
            "messaging.destination.name": queue,
            "messaging.message.id": message.message_id,
            "dramatiq_redisson.actor": message.actor_name,
            "dramatiq_redisson.attempt": int(options.get("retries") or 0) + 1,
        }
        schedule = options.get("periodic")
        times = options.get(TIMES_OPTION)
        start_ms = start_ns // 1_000_000
        sent = due = None
        if isinstance(times, dict) and isinstance(times.get("sent"), int) and isinstance(times.get("due"), int):
            sent, due = times["sent"], times["due"]
        elif isinstance(schedule, str) and isinstance(message.message_timestamp, int):
            due = message.message_timestamp  # a tick: its time on the server's clock
        if isinstance(schedule, str):
            attributes["dramatiq_redisson.periodic"] = schedule
        if due is not None:
            attributes["dramatiq_redisson.due_time"] = due
            attributes["dramatiq_redisson.wait.late_ms"] = start_ms - due
        if sent is not None and due is not None:
            attributes["dramatiq_redisson.wait.scheduled_ms"] = due - sent
            attributes["dramatiq_redisson.wait.total_ms"] = start_ms - sent
            if self.wait_spans and due > sent:
                wait = self.tracer.start_span(
                    f"wait {queue}",
                    context=parent,
                    kind=SpanKind.INTERNAL,
                    start_time=sent * 1_000_000,
                    attributes={
                        "messaging.destination.name": queue,
                        "messaging.message.id": message.message_id,
                        "dramatiq_redisson.due_time": due,
                        "dramatiq_redisson.wait.scheduled_ms": due - sent,
                        "dramatiq_redisson.wait.late_ms": start_ms - due,
                    },
                )
                wait.add_event("due", timestamp=due * 1_000_000)
                wait.end(end_time=max(start_ns, sent * 1_000_000))
        span.set_attributes(attributes)

    def after_process_message(
        self,
        broker: Broker,
        message: MessageProxy,
        *,
        result: Any | None = None,
        exception: BaseException | None = None,
    ) -> None:
        run = self._runs.get(id(message))
        if run is None:
            return
        self._stop(run)
        if exception is not None:
            run.error = True
            span = run.span
            if span.is_recording():
                span.record_exception(exception)
                span.set_attribute("error.type", type(exception).__qualname__)
                span.set_status(Status(StatusCode.ERROR, f"{type(exception).__name__}: {exception}"))

    def after_skip_message(self, broker: Broker, message: MessageProxy) -> None:
        run = self._runs.get(id(message))
        if run is None:
            return
        self._stop(run)
        run.skipped = True

    def _stop(self, run: _Run) -> None:
        """The run's code is over: its span's end time, and the context detached (on the
        worker thread, which attached it)."""
        run.end_ns = time.time_ns()
        if run.token is not None:
            token, run.token = run.token, None
            try:
                otel_context.detach(token)
            except Exception:  # pragma: no cover - OpenTelemetry logs a mismatched token itself
                self.logger.debug("Could not detach the context of message %r.", run.message_id, exc_info=True)

    def after_ack(self, broker: Broker, message: MessageProxy) -> None:
        run = self._runs.pop(id(message), None)
        if run is not None:
            outcome = "retry" if run.retried else "skipped" if run.skipped else "error" if run.error else "success"
            self._finish(run, outcome)

    def after_nack(self, broker: Broker, message: MessageProxy) -> None:
        run = self._runs.pop(id(message), None)
        if run is not None:
            self._finish(run, "failed")

    def after_worker_shutdown(self, broker: Broker, worker: Any) -> None:
        """Runs never acked nor nacked (the worker stopped first) end with outcome ``unknown``."""
        for key in list(self._runs):
            run = self._runs.pop(key, None)
            if run is not None:
                self._finish(run, "unknown")

    @staticmethod
    def _finish(run: _Run, outcome: str) -> None:
        span = run.span
        if span.is_recording():
            span.set_attribute("dramatiq_redisson.outcome", outcome)
        span.end(end_time=run.end_ns)  # None (never stopped): now

    # -- the broker's own server calls (server_spans=True) -----------------------------

    def _instrument(self, broker: Broker) -> None:
        """Wrap the script calls of a RedissonBroker (once per broker) in CLIENT spans."""
        scripts = getattr(broker, "redisson_scripts", None)
        if scripts is None or scripts in self._instrumented:
            return
        self._instrumented.add(scripts)
        for name in SERVER_CALLS:
            call = getattr(scripts, name, None)
            if call is not None:
                setattr(scripts, name, self._traced_call(name, call))

    def _traced_call(self, name: str, call: Callable[..., Any]) -> Callable[..., Any]:
        tracer = self.tracer
        local = self._local

        @functools.wraps(call)
        def traced(*args: Any, **kwargs: Any) -> Any:
            queue = _call_queue(args)
            sending = getattr(local, "sending", None)
            parent = trace.set_span_in_context(sending) if sending is not None else None
            with tracer.start_as_current_span(
                f"{name} {queue}" if queue else name,
                context=parent,
                kind=SpanKind.CLIENT,
                attributes={"db.system.name": "redis", "db.operation.name": name, "dramatiq_redisson.queue": queue},
            ):
                return call(*args, **kwargs)

        return traced


def _delay_ms(delay: Any, eta: Any, now_ms: int) -> int:
    """A send's delay in whole milliseconds as the broker reads it (a timedelta, a
    fraction rounded up, a negative one: none); else from its ``eta`` option."""
    try:
        return validate_delay(delay) or 0
    except (TypeError, ValueError):
        return max(0, eta - now_ms) if isinstance(eta, int) else 0


def _call_queue(args: Sequence[Any]) -> str:
    """The queue a script call works on: its first argument's (a ``QueueKeys``, or a
    list of calls that start with one)."""
    first = args[0] if args else None
    if isinstance(first, list | tuple) and first and isinstance(first[0], list | tuple) and first[0]:
        first = first[0][0]
    name = getattr(first, "queue_name", None)
    return name if isinstance(name, str) else ""


class TraceIdFilter(logging.Filter):
    """A logging filter that adds the current trace's ids to each record: ``trace_id``
    (32 hex digits) and ``span_id`` (16), of the running message's ``process`` span (or a
    span the actor started inside it); zeros outside any trace. Add it to a handler::

        handler.addFilter(TraceIdFilter())
        handler.setFormatter(logging.Formatter("%(trace_id)s %(span_id)s %(message)s"))
    """

    def filter(self, record: logging.LogRecord) -> bool:
        context = trace.get_current_span().get_span_context()
        if context.is_valid:
            record.trace_id = format(context.trace_id, "032x")
            record.span_id = format(context.span_id, "016x")
        else:
            record.trace_id = _INVALID_TRACE_ID
            record.span_id = _INVALID_SPAN_ID
        return True
