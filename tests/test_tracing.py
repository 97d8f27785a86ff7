"""OpenTelemetry traces across the scheduled wait (issue 49, dramatiq_redisson.tracing):
the SDK with an in-memory exporter, a real Worker on the real server. One trace from the
request that sends to the run, through a delay, a retry's back-off, a sharded queue, a
dead letter's requeue, lanes and a debounce; periodic ticks start their own; no SDK, no
spans and nothing written; Sentry's Dramatiq integration and the third-party
instrumentor beside it."""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import dramatiq
import pytest
import redis
from dramatiq import Worker
from dramatiq.middleware import CurrentMessage, default_middleware
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, StatusCode, TraceFlags

from dramatiq_redisson import RedissonBroker, periodic
from dramatiq_redisson.tracing import CONTEXT_OPTION, TIMES_OPTION, OpenTelemetry, TraceIdFilter, schedule_link
from tests.helpers import wait_for


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def provider(exporter: InMemorySpanExporter) -> Iterator[TracerProvider]:
    # A provider of the test's own: OpenTelemetry's global one can be set once per process.
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider
    provider.shutdown()


@pytest.fixture
def traced(broker: RedissonBroker, provider: TracerProvider) -> RedissonBroker:
    broker.add_middleware(OpenTelemetry(tracer_provider=provider))
    return broker


def _worker(broker: RedissonBroker) -> Worker:
    worker = Worker(broker, worker_timeout=100, worker_threads=2)
    worker.start()
    return worker


def _named(exporter: InMemorySpanExporter, prefix: str) -> list[ReadableSpan]:
    return sorted((s for s in exporter.get_finished_spans() if s.name.startswith(prefix)), key=lambda s: s.start_time)


def _runs(exporter: InMemorySpanExporter, count: int, timeout: float = 10) -> list[ReadableSpan]:
    """The first ``count`` ``process`` spans, once they ended (at their ack or nack)."""
    assert wait_for(lambda: len(_named(exporter, "process ")) >= count, timeout=timeout), exporter.get_finished_spans()
    return _named(exporter, "process ")[:count]


def _parent(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


def _attr(span: ReadableSpan, name: str) -> Any:
    assert span.attributes is not None
    return span.attributes.get(name)


def _assert_one_trace(*spans: ReadableSpan) -> None:
    assert len({s.context.trace_id for s in spans}) == 1, [s.name for s in spans]


# -- one trace from the request to the run --------------------------------------------


def test_a_delayed_send_inside_a_request_gives_one_trace_request_send_wait_run(
    traced: RedissonBroker, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    ran = threading.Event()

    @dramatiq.actor(max_retries=0)
    def greet(name: str) -> None:
        ran.set()

    tracer = provider.get_tracer("web")
    with tracer.start_as_current_span("GET /orders", kind=SpanKind.SERVER):
        message = greet.send_with_options(args=("Ada",), delay=400)
    # The context travels in the stored message's options (the delayed queue's payload)
    (_, stored) = traced.delayed_queue("default").read_all()[0]
    assert set(stored.options[CONTEXT_OPTION]) == {"traceparent"}
    assert stored.options[TIMES_OPTION]["due"] - stored.options[TIMES_OPTION]["sent"] == 400
    worker = _worker(traced)
    try:
        assert ran.wait(5)
        (run,) = _runs(exporter, 1)
    finally:
        worker.stop()
    (request,) = _named(exporter, "GET /orders")
    (send,) = _named(exporter, "send default")
    (wait,) = _named(exporter, "wait default")
    _assert_one_trace(request, send, wait, run)
    assert _parent(send) == request.context.span_id
    assert _parent(wait) == send.context.span_id and _parent(run) == send.context.span_id
    assert send.kind == SpanKind.PRODUCER and run.kind == SpanKind.CONSUMER and wait.kind == SpanKind.INTERNAL
    for span, operation in ((send, "send"), (run, "process")):
        assert _attr(span, "messaging.system") == "dramatiq"
        assert _attr(span, "messaging.operation.type") == operation
        assert _attr(span, "messaging.destination.name") == "default"
        assert _attr(span, "messaging.message.id") == message.message_id
        assert _attr(span, "dramatiq_redisson.actor") == "greet"
    assert _attr(send, "dramatiq_redisson.delay_ms") == 400 and _attr(send, "dramatiq_redisson.enqueued") is True
    # The due time the server stored, as after_enqueue hands it back
    assert _attr(send, "dramatiq_redisson.due_time") == message.options["eta"]
    assert _attr(run, "dramatiq_redisson.outcome") == "success" and _attr(run, "dramatiq_redisson.attempt") == 1
    assert _attr(run, "dramatiq_redisson.wait.scheduled_ms") == 400
    assert 0 <= _attr(run, "dramatiq_redisson.wait.late_ms") < 1000
    assert _attr(run, "dramatiq_redisson.wait.total_ms") >= 400
    # The wait is a bar from the send to the run's start, with the due time marked
    assert wait.start_time is not None and wait.end_time is not None and run.start_time is not None
    assert 400e6 <= wait.end_time - wait.start_time < 1400e6 and wait.end_time <= run.start_time + 1e6
    (due,) = wait.events
    assert due.name == "due" and wait.start_time + 399e6 <= due.timestamp <= wait.start_time + 401e6
    assert run.status.status_code == StatusCode.UNSET


def test_logs_of_a_running_message_carry_its_trace_and_span_ids(
    traced: RedissonBroker, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    lines: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(self.format(record))

    handler = Keep()
    handler.addFilter(TraceIdFilter())
    handler.setFormatter(logging.Formatter("%(trace_id)s %(span_id)s %(message)s"))
    logger = logging.getLogger("test_tracing.app")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)

    @dramatiq.actor(max_retries=0)
    def chatty() -> None:
        logger.info("working")

    try:
        logger.info("outside")
        with provider.get_tracer("web").start_as_current_span("request"):
            chatty.send_with_options(delay=50)
        worker = _worker(traced)
        try:
            (run,) = _runs(exporter, 1)
        finally:
            worker.stop()
    finally:
        logger.removeHandler(handler)
    assert lines[0] == f"{'0' * 32} {'0' * 16} outside"
    assert lines[1] == f"{run.context.trace_id:032x} {run.context.span_id:016x} working"


# -- through what the broker does to a message ----------------------------------------


def test_one_trace_through_a_retry_with_back_off(
    traced: RedissonBroker, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    attempts: list[int] = []

    @dramatiq.actor(max_retries=1, min_backoff=300, max_backoff=300)
    def flaky() -> None:
        attempts.append(1)
        if len(attempts) == 1:
            raise RuntimeError("first attempt fails")

    with provider.get_tracer("web").start_as_current_span("request"):
        flaky.send_with_options(delay=100)
    worker = _worker(traced)
    try:
        first, second = _runs(exporter, 2, timeout=15)
    finally:
        worker.stop()
    (request,) = _named(exporter, "request")
    send, retry = _named(exporter, "send default")
    waits = _named(exporter, "wait default")
    _assert_one_trace(request, send, retry, first, second, *waits)
    # request -> send -> run 1 (error, retried) -> retry's send -> run 2
    assert _parent(send) == request.context.span_id and _parent(first) == send.context.span_id
    assert _parent(retry) == first.context.span_id and _parent(second) == retry.context.span_id
    assert _attr(first, "dramatiq_redisson.outcome") == "retry" and _attr(first, "dramatiq_redisson.attempt") == 1
    assert first.status.status_code == StatusCode.ERROR and _attr(first, "error.type") == "RuntimeError"
    assert [e.name for e in first.events] == ["exception"]
    assert _attr(retry, "dramatiq_redisson.retry") is True and _attr(retry, "dramatiq_redisson.attempt") == 2
    assert 150 <= _attr(retry, "dramatiq_redisson.delay_ms") <= 300  # Retries jitters in [half, full]
    assert _attr(second, "dramatiq_redisson.outcome") == "success" and _attr(second, "dramatiq_redisson.attempt") == 2
    # The back-off is a wait of its own, under the retry's send
    assert [_parent(w) for w in waits] == [send.context.span_id, retry.context.span_id]
    assert _attr(second, "dramatiq_redisson.wait.scheduled_ms") == _attr(retry, "dramatiq_redisson.delay_ms")


def test_one_trace_through_a_sharded_queue(
    redis_url: str, redis_client: redis.Redis, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    broker = RedissonBroker(url=redis_url, middleware=[m() for m in default_middleware], shards={"default": 3})
    broker.add_middleware(OpenTelemetry(tracer_provider=provider))
    dramatiq.set_broker(broker)
    try:

        @dramatiq.actor(max_retries=0)
        def spread(i: int) -> None:
            pass

        tracer = provider.get_tracer("web")
        for i in range(6):
            with tracer.start_as_current_span(f"request {i}"):
                spread.send_with_options(args=(i,), delay=200)
        # Sends go to the shards in turn: every shard holds scheduled messages
        shards = broker.stats("default")["queues"]["default"]["shards"]
        assert [shards[name]["scheduled"] for name in broker.shard_router.consumed("default")] == [2, 2, 2]
        worker = _worker(broker)
        try:
            runs = _runs(exporter, 6)
        finally:
            worker.stop()
    finally:
        broker.flush_all()
        broker.close()
    sends = {_attr(s, "messaging.message.id"): s for s in _named(exporter, "send default")}
    for run in runs:
        send = sends[_attr(run, "messaging.message.id")]
        (request,) = [s for s in _named(exporter, "request ") if s.context.span_id == _parent(send)]
        _assert_one_trace(request, send, run)
        assert _parent(run) == send.context.span_id and _attr(run, "dramatiq_redisson.outcome") == "success"
        assert _attr(run, "messaging.destination.name") == "default"
    assert len({r.context.trace_id for r in runs}) == 6


def test_one_trace_after_a_dead_letter_is_requeued(
    traced: RedissonBroker, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    healed = threading.Event()

    @dramatiq.actor(max_retries=0)
    def fragile() -> None:
        if not healed.is_set():
            raise ValueError("broken until healed")

    with provider.get_tracer("web").start_as_current_span("request"):
        message = fragile.send_with_options(delay=100)
    worker = _worker(traced)
    try:
        (failed,) = _runs(exporter, 1)
        assert _attr(failed, "dramatiq_redisson.outcome") == "failed"
        assert wait_for(lambda: traced.dead_letters("default").size() == 1)
        healed.set()
        assert traced.dead_letters("default").requeue(message.message_id) is True
        _, again = _runs(exporter, 2)
    finally:
        worker.stop()
    (request,) = _named(exporter, "request")
    (send,) = _named(exporter, "send default")
    _assert_one_trace(request, send, failed, again)
    assert _parent(failed) == send.context.span_id and _parent(again) == send.context.span_id
    assert _attr(again, "dramatiq_redisson.outcome") == "success"
    assert failed.status.status_code == StatusCode.ERROR and again.status.status_code == StatusCode.UNSET


def test_lanes_and_a_debounce_keep_the_context_of_the_last_send(
    traced: RedissonBroker, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    @dramatiq.actor(max_retries=0)
    def reindex(n: int) -> None:
        pass

    tracer = provider.get_tracer("web")
    options = {"dedupe_key": "reindex:42", "dedupe": "replace", "broker_priority": 2, "group_key": "tenant-7"}
    for n in range(3):
        with tracer.start_as_current_span(f"edit {n}"):
            reindex.send_with_options(args=(n,), delay=300, **options)
    worker = _worker(traced)
    try:
        (run,) = _runs(exporter, 1)
    finally:
        worker.stop()
    sends = _named(exporter, "send default")
    assert len(sends) == 3
    last = sends[-1]
    (edit,) = _named(exporter, "edit 2")
    # The debounced message is the last send's: it runs in the last request's trace
    _assert_one_trace(edit, last, run)
    assert _parent(run) == last.context.span_id
    assert _attr(last, "dramatiq_redisson.dedupe_key") == "reindex:42"
    assert _attr(last, "dramatiq_redisson.broker_priority") == 2
    assert _attr(last, "dramatiq_redisson.group_key") == "tenant-7"
    assert _attr(run, "messaging.message.id") == _attr(last, "messaging.message.id")


def test_a_send_kept_out_by_its_dedupe_key_ends_its_span_unconfirmed(
    traced: RedissonBroker, provider: TracerProvider, exporter: InMemorySpanExporter, redis_client: redis.Redis
) -> None:
    @dramatiq.actor(max_retries=0)
    def once() -> None:
        pass

    first = once.send_with_options(delay=60_000, dedupe_key="k")
    before = sorted(redis_client.keys("*"))
    kept = once.send_with_options(delay=60_000, dedupe_key="k")
    assert kept.message_id == first.message_id and sorted(redis_client.keys("*")) == before
    confirmed, unconfirmed = _named(exporter, "send default")
    assert _attr(confirmed, "dramatiq_redisson.enqueued") is True
    assert _attr(unconfirmed, "dramatiq_redisson.enqueued") is False


def test_server_spans_show_the_brokers_own_calls_when_asked(
    broker: RedissonBroker, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    broker.add_middleware(OpenTelemetry(tracer_provider=provider, server_spans=True))

    @dramatiq.actor(max_retries=0)
    def quick() -> None:
        pass

    with provider.get_tracer("web").start_as_current_span("request"):
        quick.send_with_options(delay=100)
    worker = _worker(broker)
    try:
        _runs(exporter, 1)
        assert wait_for(lambda: _named(exporter, "ack default") != [])
    finally:
        worker.stop()
    (send,) = _named(exporter, "send default")
    (offer,) = _named(exporter, "offer_one default")
    assert _parent(offer) == send.context.span_id and offer.kind == SpanKind.CLIENT
    assert _attr(offer, "db.system.name") == "redis" and _attr(offer, "db.operation.name") == "offer_one"
    assert _named(exporter, "transfer default") != [] and _named(exporter, "fetch default") != []


# -- periodic ticks --------------------------------------------------------------------


def test_a_periodic_tick_starts_a_trace_of_its_own_linked_to_its_schedule(
    traced: RedissonBroker, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    name = f"traced-{uuid.uuid4().hex[:8]}"

    def ticking() -> None:
        pass

    ticking.__name__ = f"ticking_{name.replace('-', '_')}"
    periodic(every="300ms", name=name)(dramatiq.actor(ticking, max_retries=0))
    worker = _worker(traced)
    try:
        first, second = _runs(exporter, 2, timeout=10)
    finally:
        worker.stop()
        traced.schedules.remove(name)
    for run in (first, second):
        assert run.parent is None and _attr(run, "dramatiq_redisson.periodic") == name
        (link,) = run.links
        assert link.context == schedule_link(name).context
        assert 0 <= _attr(run, "dramatiq_redisson.wait.late_ms") < 1000
        assert str(_attr(run, "messaging.message.id")).startswith(f"periodic:{name}:")
    assert first.context.trace_id != second.context.trace_id
    assert _named(exporter, "send ") == [] and _named(exporter, "wait ") == []


# -- without an SDK --------------------------------------------------------------------


def test_without_an_sdk_the_middleware_records_nothing_and_writes_nothing(broker: RedissonBroker) -> None:
    assert isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)  # no global SDK
    broker.add_middleware(OpenTelemetry(server_spans=True))  # the global (no-op) provider
    broker.add_middleware(CurrentMessage())
    seen: list[dict[str, Any]] = []

    @dramatiq.actor(max_retries=0)
    def plain(i: int) -> None:
        message = CurrentMessage.get_current_message()
        assert message is not None
        seen.append(dict(message.options))

    plain.send_with_options(args=(0,), delay=50)
    broker.enqueue_many([plain.message(i) for i in (1, 2)], delay=50)
    # A trace to continue (from upstream) is passed on, with nothing recorded
    upstream = SpanContext(trace_id=0xABC, span_id=0xDEF, is_remote=True, trace_flags=TraceFlags(TraceFlags.SAMPLED))
    with trace.use_span(NonRecordingSpan(upstream)):
        plain.send_with_options(args=(3,), delay=50)
    worker = _worker(broker)
    try:
        assert wait_for(lambda: len(seen) == 4)
    finally:
        worker.stop()
    # Only the message sent inside the upstream trace carries a context, that trace's
    written = [o.get(CONTEXT_OPTION) for o in seen if CONTEXT_OPTION in o or TIMES_OPTION in o]
    assert written == [{"traceparent": f"00-{0xABC:032x}-{0xDEF:016x}-01"}]
    # The middleware made only the API's no-op spans, and never loads the SDK
    middleware = next(m for m in broker.middleware if isinstance(m, OpenTelemetry))
    assert not middleware.tracer.start_span("probe").is_recording()
    # (redis-py imports the SDK's metrics when it is installed; not its tracing)
    script = (
        "import sys, dramatiq_redisson.tracing as t; t.OpenTelemetry(server_spans=True); "
        "sys.exit(any(m.startswith('opentelemetry.sdk.trace') for m in sys.modules))"
    )
    assert subprocess.run([sys.executable, "-c", script], timeout=60).returncode == 0


# -- beside what users already run ------------------------------------------------------


def test_sentry_still_reports_errors_with_the_right_actor_and_message(
    redis_url: str, redis_client: redis.Redis, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    sentry_sdk = pytest.importorskip("sentry_sdk")
    from sentry_sdk.integrations.dramatiq import DramatiqIntegration, SentryMiddleware
    from sentry_sdk.transport import Transport

    events: list[dict[str, Any]] = []

    class Keep(Transport):  # type: ignore[misc]
        def capture_envelope(self, envelope: Any) -> None:
            events.extend(item.payload.json for item in envelope.items if item.type == "event")

    sentry_sdk.init(
        dsn="https://public@sentry.invalid/1",
        transport=Keep,
        integrations=[DramatiqIntegration()],
        default_integrations=False,
        auto_enabling_integrations=False,
    )
    try:
        # Sentry patches Broker.__init__: the broker must come after sentry_sdk.init
        broker = RedissonBroker(url=redis_url, middleware=[m() for m in default_middleware])
        assert isinstance(broker.middleware[0], SentryMiddleware)
        broker.add_middleware(OpenTelemetry(tracer_provider=provider))
        dramatiq.set_broker(broker)

        @dramatiq.actor(max_retries=0)
        def charge(order: int) -> None:
            raise ValueError(f"card declined for order {order}")

        with provider.get_tracer("web").start_as_current_span("checkout"):
            message = charge.send_with_options(args=(42,), delay=200)
        worker = _worker(broker)
        try:
            (run,) = _runs(exporter, 1)
            assert wait_for(lambda: len(events) == 1)
        finally:
            worker.stop()
            broker.flush_all()
            broker.close()
    finally:
        sentry_sdk.get_client().close()
        sentry_sdk.get_global_scope().set_client(None)
    (event,) = events
    (error,) = event["exception"]["values"]
    assert error["type"] == "ValueError" and error["value"] == "card declined for order 42"
    data = event["contexts"]["dramatiq"]["data"]
    assert data["actor_name"] == "charge" and data["message_id"] == message.message_id and data["args"] == [42]
    assert event["extra"]["dramatiq_message_id"] == message.message_id
    assert _attr(run, "dramatiq_redisson.outcome") == "failed" and _attr(run, "error.type") == "ValueError"


def test_the_third_party_instrumentors_context_survives_the_delayed_path(
    traced: RedissonBroker, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    instrumentor_module = pytest.importorskip("opentelemetry_instrumentor_dramatiq")
    instrumentor = instrumentor_module.DramatiqInstrumentor()
    instrumentor.instrument(tracer_provider=provider)
    try:

        @dramatiq.actor(max_retries=0)
        def both() -> None:
            pass

        with provider.get_tracer("web").start_as_current_span("request"):
            both.send_with_options(delay=300)
        (_, stored) = traced.delayed_queue("default").read_all()[0]
        assert "traceparent" in stored.options["options"]["trace_context"]
        worker = _worker(traced)
        try:
            (run,) = _runs(exporter, 1)
            assert wait_for(lambda: len(_named(exporter, "dramatiq.worker.")) == 1)
        finally:
            worker.stop()
    finally:
        instrumentor.uninstrument()
    (request,) = _named(exporter, "request")
    (their_send,) = _named(exporter, "dramatiq.producer.both")
    (their_run,) = _named(exporter, "dramatiq.worker.")
    (send,) = _named(exporter, "send default")
    _assert_one_trace(request, their_send, their_run, send, run)
    assert _parent(their_run) == their_send.context.span_id
    assert _parent(run) == send.context.span_id
