"""The brokers under test: made by kind (``redisson``, ``builtin``, ``redisson-lrem``) and
instrumented to read the due time of the last offer; the scripts' names; bulk offers."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ._base import BROKER_KINDS, NAMESPACE, QUEUE
from ._internals import reference_lua
from ._measure import script_sha
from ._server import Server


def add_tracing(broker: Any) -> bool:
    """Add ``dramatiq_redisson.tracing.OpenTelemetry`` to ``broker`` with OpenTelemetry's
    global tracer provider, which nothing here configures: the API's no-op, what an app
    without an SDK pays (the ``*-otel`` scenarios). False when the product has no such
    module (a ref from before it) or ``opentelemetry-api`` is missing: the run goes on
    without it, and says so in its JSON (``otel``)."""
    import dramatiq_redisson

    try:
        from dramatiq_redisson import tracing
    except ImportError:
        return False
    # The venv's editable install answers a submodule the product lacks with this
    # checkout's: only the product's own module counts.
    if Path(tracing.__file__).resolve().parent != Path(dramatiq_redisson.__file__).resolve().parent:
        return False
    broker.add_middleware(tracing.OpenTelemetry())
    return True


def make_broker(kind: str, url: str, **options: Any) -> Any:
    """A broker of one kind, instrumented so that the server-computed due time of the last
    single offer is readable (``broker.bench_last_dues``; also when the offer raised
    ``NotReplicated``: the write is on the primary). ``options`` go to ``RedissonBroker``
    (``cluster=True``, ``wait_for_replicas``…)."""
    if kind == "builtin":
        from dramatiq.brokers.redis import RedisBroker

        return RedisBroker(url=url, namespace=NAMESPACE, **options)
    if kind == "redisson":
        from dramatiq_redisson import RedissonBroker

        broker: Any = RedissonBroker(url=url, namespace=NAMESPACE, **options)
    elif kind == "redisson-lrem":
        from ._lrem import LremRedissonBroker

        broker = LremRedissonBroker(url=url, namespace=NAMESPACE, **options)
    else:
        raise ValueError(f"unknown broker kind {kind!r} (choose from {', '.join(BROKER_KINDS)})")
    try:
        from dramatiq_redisson import NotReplicated
    except ImportError:  # a product from before it (8d27b2a, measured with --product)

        class NotReplicated(Exception):  # type: ignore[no-redef]  # nothing raises it there
            pass

    scripts = broker.redisson_scripts
    original_offer = scripts.offer

    def offer(keys: Any, entries: Any, *, client: Any = None, **options: Any) -> Any:
        try:
            result = original_offer(keys, entries, client=client, **options)
        except NotReplicated as e:
            if client is None:
                broker.bench_last_dues = getattr(e, "reply", None)
            raise
        if client is None:
            broker.bench_last_dues = result
        return result

    scripts.offer = offer
    if hasattr(scripts, "offer_one"):  # the one-message offer (releases after 2026-11-25)
        original_one = scripts.offer_one

        def offer_one(*args: Any, **options: Any) -> Any:
            try:
                due = original_one(*args, **options)
            except NotReplicated as e:
                broker.bench_last_dues = [getattr(e, "reply", None)]
                raise
            broker.bench_last_dues = [due]
            return due

        scripts.offer_one = offer_one
    return broker


def script_names(broker: Any) -> dict[str, str]:
    """sha -> name of every script the broker (and the harness) runs."""
    from . import _actor

    names = {script_sha(_actor.RECORD_LUA): "recorder"}
    try:
        names[script_sha(reference_lua())] = "reference-transfer"
    except ImportError:  # a product from before lua includes (8d27b2a, with --product): no such variant
        pass
    if hasattr(broker, "redisson_scripts"):
        for name, script in broker.redisson_scripts._s.items():
            names[script.sha] = name
        library = getattr(broker.redisson_scripts, "library", None)  # FCALL's functions (issue 55)
        for name, function in (library.functions if library is not None else {}).items():
            names[function] = name
    if hasattr(broker, "scripts"):
        for name, script in broker.scripts.items():
            names[script.sha] = name
    return names


def due_of(broker: Any, kind: str, message: Any) -> float:
    """The due time (epoch ms) of a message just offered one by one."""
    if kind == "builtin":
        return float(message.options["eta"])  # producer clock == server clock (same host)
    return float(broker.bench_last_dues[0])  # computed by offer.lua from the server's TIME


def queue_keys(kind: str) -> Any:
    from dramatiq_redisson import QueueKeys

    return QueueKeys(NAMESPACE, QUEUE)


def bulk_offer(
    broker: Any,
    kind: str,
    actor: Any,
    seqs: Sequence[int],
    delay_ms: int,
    chunk: int = 10_000,
    read_dues: bool = False,
    server: Server | None = None,
) -> dict[int, float]:
    """Offer delayed messages in bulk: ``enqueue_many`` for the Redisson brokers; for the
    built-in broker, the same ``dispatch.lua`` "enqueue" call that ``RedisBroker.enqueue``
    makes, pipelined, with one eta for all. Returns seq -> due ms when ``read_dues``."""
    dues: dict[int, float] = {}
    if kind == "builtin":
        from dramatiq.common import current_millis, dq_name

        broker._max_unpack_size()
        dispatch = broker.scripts["dispatch"]
        eta = current_millis() + delay_ms
        dq = dq_name(QUEUE)
        for start in range(0, len(seqs), chunk):
            with broker.client.pipeline(transaction=False) as pipe:
                for seq in seqs[start : start + chunk]:
                    m = actor.message(seq)
                    m = m.copy(queue_name=dq, options={"redis_message_id": str(uuid.uuid4()), "eta": eta})
                    args = [
                        "enqueue",
                        current_millis(),
                        dq,
                        broker.broker_id,
                        broker.heartbeat_timeout,
                        broker.dead_message_ttl,
                        0,
                        broker._max_unpack_size(),
                        m.options["redis_message_id"],
                        m.encode(),
                    ]
                    dispatch(keys=[broker.namespace], args=args, client=pipe)
                    if read_dues:
                        dues[seq] = float(eta)
                pipe.execute()
        return dues
    keys = broker.keys(QUEUE)
    before = server.now_ms() if (read_dues and server) else None
    for start in range(0, len(seqs), chunk):
        part = seqs[start : start + chunk]
        messages = broker.enqueue_many([actor.message(seq) for seq in part], delay=delay_ms)
        if read_dues:
            with broker.client.pipeline(transaction=False) as pipe:
                for m in messages:
                    pipe.zscore(keys.timeout_zset, m.options["redis_message_id"])
                scores = pipe.execute()
            for seq, score in zip(part, scores, strict=False):
                # An entry that already moved lost its score: fall back to a lower bound.
                dues[seq] = float(score) if score is not None else float((before or 0) + delay_ms)
    return dues
