"""The producer side of a broker: one send, a bulk send, and a retry's re-enqueue.

:class:`Producer` turns :meth:`RedissonBroker.enqueue` and ``enqueue_many`` into script
calls (offer.lua for delayed messages, enqueue.lua for immediate ones) and their outcomes
into the errors the package promises (:class:`~._errors.EnqueueError` lists what was
written). How a bulk send is cut into calls (:func:`pack`) and how their outcomes are
sorted out (:func:`sort_outcomes`) are plain functions, testable without a server.

It may import the leaf modules (messages, keys, errors, ids) and the script wrappers;
never the sharding package (a send's shard comes from the ``route`` it is given). The
broker builds it with what it uses: the scripts, the client, the held ids, the calls it
makes of the broker and the few members it reads at each send (:class:`ProducerHost`).
"""

from __future__ import annotations

import difflib
import logging
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, cast

import redis
from dramatiq.actor import Actor
from dramatiq.broker import MessageProxy
from dramatiq.common import compute_backoff
from dramatiq.message import Message
from dramatiq.middleware import Middleware

from ._errors import EnqueueError, EnqueueNotReplicated, MissingPermission, NotReplicated, ServerMemoryFull
from ._ids import next_sort_keys
from ._keys import PLAIN_LANE, QueueKeys
from ._message import (
    DEDUPE_OPTIONS,
    dedupe_options,
    encode_message,
    encode_scheduled,
    eta_estimate,
    kept_message,
    prepare,
    prepare_scheduled,
    validate_delay,
)
from ._queue_names import base_queue
from .connection._permissions import check_permissions, is_permission_error
from .flow._lanes import FLOW_OPTIONS, message_lane
from .scripts._runner import Outcomes, Unanswered

if TYPE_CHECKING:
    from ._held import HeldMessages
    from ._settings import BrokerSettings
    from .connection._commands import Commands
    from .scripts._calls import Scripts

#: Most messages one script call of :meth:`RedissonBroker.enqueue_many` carries (keeps
#: each call to a few ms even with a million scheduled).
BULK_CHUNK_SIZE = 100

#: Longest time (ms) a worker keeps retrying the re-enqueue of a message it is processing
#: (a retry scheduled by the Retries middleware) while the server is unreachable or
#: loading; the message's copy in flight is not acked meanwhile. Past it, that copy is
#: left unacked and requeued by the consumer, so the message is never lost.
REDELIVERY_RETRY_TIME = 30_000

#: Longest pause (ms) between two of those attempts; the first pause is 100 ms.
MAX_REDELIVERY_BACKOFF = 2000

#: A keyed send's dedupe key, mode and throttle ttl (see :func:`._message.dedupe_options`).
Dedupe = tuple[str, str, int]

#: The message options Dramatiq reads or writes (its middleware's, pipelines', groups',
#: brokers'), and this package's: dedupe keys, lanes, periodic ticks', tracing's.
KNOWN_OPTIONS = frozenset(
    "delay eta redis_message_id retries traceback requeue_timestamp max_retries min_backoff max_backoff "
    "retry_when throws on_retry_exhausted max_age time_limit notify_shutdown on_success on_failure pipe_target "
    "pipe_ignore group_completion_uuid group_completion_callbacks store_results result_ttl broker_priority "
    "periodic periodic_start_deadline_ms periodic_jitter_ms trace_context trace_times".split()
).union(DEDUPE_OPTIONS, FLOW_OPTIONS)

#: How close (``difflib`` ratio) an unknown option's name must be to a known one for a
#: send to warn: close enough for ``dela`` (delay), ``time_limt`` or ``dedup_key``, far
#: enough that custom options such as ``trace_id`` or ``priority`` pass silently.
OPTION_MATCH_CUTOFF = 0.75


@dataclass
class BulkCalls:
    """A bulk send cut into script calls (see :func:`pack`).

    Attributes:
      scheduled: offer.lua calls, ``(keys, args, laned)`` (``laned``: the call's entries
        carry their lanes, see :mod:`dramatiq_redisson.flow._lanes`).
      ready: enqueue.lua calls, ``(keys, [(redis id, data, lane), ...])``.
      chunks: Per call (in the order sent), the indexes of its messages.
      keyed: The calls in offer.lua's "rel" mode, which reply per entry, by index
        into ``chunks``, with their queue's name.
    """

    scheduled: list[tuple[QueueKeys, list[Any], bool]] = field(default_factory=list)
    ready: list[tuple[QueueKeys, list[tuple[str, bytes, str]]]] = field(default_factory=list)
    chunks: list[list[int]] = field(default_factory=list)
    keyed: dict[int, str] = field(default_factory=dict)


#: Added to the client's retry span before a delayed send skips the lookup of a member
#: that already came due (see ``Producer._resend_lookup``): the first run of the call
#: may reach the server a moment after the client sent it.
RESEND_MARGIN_MS = 1000


def pack(
    prepared: list[Message[Any]],
    sort_keys: list[str],
    dedupes: list[Dedupe | None],
    delay_ms: int | None,
    keys_of: Callable[[str], QueueKeys],
    chunk_size: int = BULK_CHUNK_SIZE,
    lanes: list[str] | None = None,
    targets: list[str] | None = None,
) -> BulkCalls:
    """Cut prepared messages into script calls: per queue, in chunks of ``chunk_size``.

    Everything is encoded here, before the first write: an argument that cannot be
    encoded is bad input, and bad input writes nothing. ``lanes``: each message's lane
    (flow control); a call with a laned message passes every entry's lane. ``targets``:
    each message's internal queue (a sharded queue's shard; default its queue)."""
    lane_of = lanes or [PLAIN_LANE] * len(prepared)
    by_queue: dict[str, list[int]] = defaultdict(list)
    for index, message in enumerate(prepared):
        by_queue[targets[index] if targets else message.queue_name].append(index)
    packed = BulkCalls()
    for queue_name, indexes in by_queue.items():
        keys = keys_of(queue_name)
        for start in range(0, len(indexes), chunk_size):
            chunk = indexes[start : start + chunk_size]
            packed.chunks.append(chunk)
            laned = any(lane_of[i] != PLAIN_LANE for i in chunk)
            if delay_ms and any(dedupes[i] for i in chunk):
                # Messages with dedupe keys: one entry each, in order (a later entry
                # with the same key finds the earlier one scheduled).
                packed.keyed[len(packed.chunks) - 1] = base_queue(queue_name)
                args: list[Any] = ["rel"]
                for i in chunk:
                    data = encode_scheduled(prepared[i], sort_keys[i])
                    args.extend((delay_ms, sort_keys[i], prepared[i].message_id, data, ""))
                    args.extend(dedupes[i] or ("", "", 0))
                    if laned:
                        args.append(lane_of[i])
                packed.scheduled.append((keys, args, laned))
            elif delay_ms:
                entries: list[Any] = ["bulk", delay_ms]  # flat: fewer objects for the garbage collector
                for i in chunk:
                    entries.append(prepared[i].message_id)
                    entries.append(sort_keys[i].encode() + encode_scheduled(prepared[i], sort_keys[i]))
                    if laned:
                        entries.append(lane_of[i])
                packed.scheduled.append((keys, entries, laned))
            else:
                triples = [
                    (prepared[i].options["redis_message_id"], encode_message(prepared[i]), lane_of[i]) for i in chunk
                ]
                packed.ready.append((keys, triples))
    return packed


@dataclass
class BulkOutcome:
    """What each message of a bulk send became (indexes into the prepared list).

    Attributes:
      enqueued, failed, unknown: As :class:`~._errors.EnqueueError`'s lists.
      errors: The errors of the calls that failed or went unanswered.
      kept: Messages kept out by their dedupe key, and the message holding it.
      dues: Due times the calls stored (server clock), where known.
      duplicates: Per ready call that skipped messages already there, ``(index of its
        first message, how many it had, how many it pushed)``.
    """

    enqueued: list[int] = field(default_factory=list)
    failed: list[int] = field(default_factory=list)
    unknown: list[int] = field(default_factory=list)
    errors: list[Exception] = field(default_factory=list)
    kept: dict[int, Message[Any]] = field(default_factory=dict)
    dues: dict[int, int] = field(default_factory=dict)
    duplicates: list[tuple[int, int, int]] = field(default_factory=list)


def sort_outcomes(packed: BulkCalls, outcomes: list[Any], delay_ms: int | None) -> BulkOutcome:
    """Sort the messages of a bulk send by the outcome of their call: an :class:`Unanswered`
    (sent: unknown, else failed), an error (failed), a per-entry reply of a keyed call
    (a due time, or the message that kept it out), or ``[due, pushed]`` of a plain one."""
    result = BulkOutcome()
    for n, (chunk, outcome) in enumerate(zip(packed.chunks, outcomes, strict=True)):
        if isinstance(outcome, Unanswered):
            (result.unknown if outcome.sent else result.failed).extend(chunk)
            result.errors.append(outcome.error)
        elif isinstance(outcome, Exception):
            result.failed.extend(chunk)
            result.errors.append(outcome)
        elif n in packed.keyed:
            for i, reply in zip(chunk, outcome, strict=True):
                if isinstance(reply, list):
                    result.kept[i] = kept_message(reply, packed.keyed[n])
                else:
                    result.enqueued.append(i)
                    if int(reply) >= 0:
                        result.dues[i] = int(reply)
        else:
            result.enqueued.extend(chunk)
            if delay_ms and int(outcome[1]) >= 0:
                result.dues.update((i, int(outcome[1])) for i in chunk)
            if not delay_ms and int(outcome[1]) < len(chunk):
                result.duplicates.append((chunk[0], len(chunk), int(outcome[1])))
    result.enqueued.sort()
    result.failed.sort()
    result.unknown.sort()
    return result


def not_replicated_error(
    error: NotReplicated,
    *,
    enqueued: list[Message[Any]],
    failed: list[Message[Any]],
    unknown: list[Message[Any]],
) -> EnqueueNotReplicated:
    """The error of an enqueue that too few replicas acknowledged."""
    lost = f"; {len(failed)} not enqueued and {len(unknown)} unknown" if failed or unknown else ""
    return EnqueueNotReplicated(
        f"{len(enqueued)} message(s) enqueued{lost}: {error}",
        enqueued=enqueued,
        failed=failed,
        unknown=unknown,
        replicas=error.replicas,
        wanted=error.wanted,
        timeout_ms=error.timeout_ms,
    )


def memory_full_error(
    client: Commands,
    error: redis.exceptions.OutOfMemoryError,
    *,
    enqueued: list[Message[Any]],
    failed: list[Message[Any]],
    unknown: list[Message[Any]],
) -> ServerMemoryFull:
    """The error for a server that refused a write at its memory limit (``client`` is
    asked for the figures, if it may)."""
    queue_names = sorted({m.queue_name for m in failed})
    maxmemory = used = None
    policy = "?"
    try:
        info = client.info("memory")
        maxmemory, used = int(info["maxmemory"]), int(info["used_memory"])
        policy = str(info.get("maxmemory_policy", "?"))
    except Exception:  # INFO may be refused (ACL) or the connection gone: the message says less
        pass
    usage = (
        f"used memory {used} B is over maxmemory {maxmemory} B (maxmemory-policy {policy})"
        if maxmemory is not None
        else "used memory is over maxmemory"
    )
    text = (
        f"Redis refused to enqueue {len(failed)} message(s) on queue(s) {', '.join(map(repr, queue_names))}: "
        f"the server is full ({usage}); nothing of the refused message(s) was written. "
        f"Free memory (let workers drain the queues) or raise maxmemory. Server said: {error}"
    )
    return ServerMemoryFull(
        text,
        enqueued=enqueued,
        failed=failed,
        unknown=unknown,
        queue_names=queue_names,
        maxmemory=maxmemory,
        used_memory=used,
    )


def enqueue_error(client: Commands, prepared: list[Message[Any]], outcome: BulkOutcome) -> EnqueueError:
    """The error of a bulk send some of whose calls failed; the first error is the cause."""
    lists = {
        "enqueued": [prepared[i] for i in outcome.enqueued],
        "failed": [prepared[i] for i in outcome.failed],
        "unknown": [prepared[i] for i in outcome.unknown],
    }
    errors = outcome.errors
    oom = next((e for e in errors if isinstance(e, redis.exceptions.OutOfMemoryError)), None)
    error: EnqueueError
    if oom is not None:
        error = memory_full_error(client, oom, **lists)
        error.__cause__ = oom
        return error
    error = EnqueueError(
        f"{len(outcome.failed)} of {len(prepared)} messages were not enqueued and {len(outcome.unknown)} may or "
        f"may not have been ({len(outcome.enqueued)} were): {type(errors[0]).__name__}: {errors[0]}",
        **lists,
    )
    error.__cause__ = errors[0]
    return error


class OptionNames:
    """Warns, through the broker's logger, once per actor and option name, of a message
    option that no part reads but whose name is close to one that a part reads
    (``send_with_options(dela=5000)``: did you mean ``delay``?). The option is still sent:
    Dramatiq passes unknown options on, and user code may read its own. The known names:
    :data:`KNOWN_OPTIONS`, the broker's ``actor_options`` and those of each middleware
    added to it (a third-party one's too), gathered again when an unknown name comes and
    the middleware changed. A send whose names were all seen costs a few set lookups."""

    def __init__(self, logger: logging.Logger) -> None:
        self.logger = logger
        self.known = KNOWN_OPTIONS
        #: The middleware the known names were gathered from (None: not yet).
        self.gathered_from: tuple[Middleware, ...] | None = None
        #: (actor name, option name) pairs already looked at: warned of or passed.
        self.seen: set[tuple[str, str]] = set()

    def check(self, message: Message[Any], host: ProducerHost) -> None:
        """Warn of each option name of ``message`` that looks misspelt, once per actor."""
        for name in message.options:
            if name in self.known or (message.actor_name, name) in self.seen:
                continue
            middleware = tuple(host.middleware)
            if middleware != self.gathered_from:
                names = [getattr(each, "actor_options", None) or () for each in middleware]
                self.known = KNOWN_OPTIONS.union(host.actor_options, *names)
                self.gathered_from = middleware
            if name in self.known:
                continue
            self.seen.add((message.actor_name, name))
            close = difflib.get_close_matches(name, sorted(self.known), n=1, cutoff=OPTION_MATCH_CUTOFF)
            if close:
                self.logger.warning(
                    "Actor %r was sent message option %r, which neither Dramatiq, this broker nor its "
                    "middleware reads: did you mean %r? The message goes with the option as given "
                    "(unknown options are passed on); this is logged once per actor and option.",
                    message.actor_name,
                    name,
                    close[0],
                )


class ProducerHost(Protocol):
    """What the producer reads of its broker at each send, as it is then: its settings
    (some may be set after the broker is built), the server's version (known once the
    server was checked), its actors (a lane's defaults), its middleware (whether any
    implements a hook) and the actor options it and its middleware declare (the options
    a send may carry)."""

    actors: dict[str, Actor[..., Any]]
    middleware: list[Middleware]
    actor_options: set[str]

    @property
    def settings(self) -> BrokerSettings: ...

    @property
    def server_version(self) -> tuple[int, int, int] | None: ...


#: Where one send goes: ``route(queue_name, options, in_flight)`` -> the internal queue
#: name (a sharded queue's shard; a retry's, the shard its copy in flight runs from).
Route = Callable[[str, dict[str, Any], str], str]

#: Where a batch of sends goes: ``route_many([(queue_name, options), ...], run)`` -> their
#: internal queue names (runs of ``run`` messages any shard may take go to one shard).
RouteMany = Callable[[Sequence[tuple[str, dict[str, Any]]], int], list[str]]


class Producer:
    """Sends for one broker.

    Args:
      host: What it reads of the broker at each send (:class:`ProducerHost`).
      scripts: The broker's script wrappers (offer, offer_one, enqueue and their bulk calls).
      client: The broker's client: the queue registry's ``SADD``, the memory figures of a
        refused write, the permission probe of a refused send.
      held: The ids this process's consumers hold (a retry's copy in flight).
      keys: A queue's keys, by its internal name.
      route, route_many: Where sends go (the broker's shard router).
      check_server: The once-per-broker server check, unless the server cannot be asked.
      emit_before, emit_after: The broker's middleware signals.
      worker_id: The broker's id (the permission probe's token).
      retry_span: How long (ms) the client retries a command (None: unbounded).
      resend_lookup: Where offer_one.lua looks for a resent member that came due.
      logger_name: The logger it logs to (its broker's).
    """

    def __init__(
        self,
        host: ProducerHost,
        *,
        scripts: Scripts,
        client: Commands,
        held: HeldMessages,
        keys: Callable[[str], QueueKeys],
        route: Route,
        route_many: RouteMany,
        check_server: Callable[[], None],
        emit_before: Callable[..., None],
        emit_after: Callable[..., None],
        worker_id: str,
        retry_span: int | None,
        resend_lookup: str,
        logger_name: str,
    ) -> None:
        self.host = host
        self.scripts = scripts
        self.client = client
        self.held = held
        self.keys = keys
        self.route = route
        self.route_many = route_many
        self.check_server = check_server
        self.emit_before = emit_before
        self.emit_after = emit_after
        self.worker_id = worker_id
        self.retry_span = retry_span
        self.resend_lookup = resend_lookup
        self.logger = logging.getLogger(logger_name)
        #: Queues this process listed in the queue registry (see :meth:`register_queue`).
        self.registered: set[str] = set()
        #: The check of a send's option names (see :class:`OptionNames`).
        self.option_names = OptionNames(self.logger)

    def _hooked(self, signal: str) -> bool:
        """Whether any middleware implements ``signal`` (else emitting it is a no-op): only
        the base class's own no-op method, looked up as ``emit_before`` does, counts as none."""
        base = getattr(Middleware, signal)
        return any(getattr(getattr(m, signal), "__func__", None) is not base for m in self.host.middleware)

    # -- one message ---------------------------------------------------------------

    def enqueue(self, message: Message[Any], delay: Any) -> Message[Any]:
        """:meth:`RedissonBroker.enqueue` (see there)."""
        in_flight = ""  # the redis id of the copy being processed, for a retry
        if isinstance(message, MessageProxy):
            delay_ms = self._redelivery_delay(message, delay)
            in_flight = str(message.options.get("redis_message_id") or "")
            dedupe = self._retry_dedupe(message, delay_ms)
        else:
            delay_ms = validate_delay(delay)
            dedupe = dedupe_options(message.options, delay_ms)
            # A fresh send (a retry carries the options its first send was checked with).
            self.option_names.check(message, self.host)
        message, sort_key = prepare(message, delay_ms)
        keys = self.keys(self.route(message.queue_name, message.options, in_flight))
        self.logger.debug(
            "Enqueueing message %r on queue %r (delay %r ms).", message.message_id, keys.queue_name, delay_ms
        )
        estimate = eta_estimate(delay_ms)
        self.check_server()
        self._emit_before_enqueue(message, delay, estimate)
        due = self._write(keys, message, sort_key, delay_ms, in_flight, dedupe)
        if in_flight:
            # Its ack counts it as retried in the history (see _history.py).
            self.held.mark_retried(in_flight)
        if isinstance(due, Message):
            # Kept out by its dedupe key: nothing was written; the message holding the key.
            self.logger.debug(
                "Message %r not scheduled on queue %r: dedupe key %r is held by message %r.",
                message.message_id,
                keys.queue_name,
                message.options.get("dedupe_key"),
                due.message_id,
            )
            return due
        if estimate is not None:
            # The due time the offer stored (server clock), as the built-in broker's eta.
            message.options["eta"] = due if due is not None else estimate
        self.emit_after("enqueue", message, delay)
        return message

    def _write(
        self,
        keys: QueueKeys,
        message: Message[Any],
        sort_key: str,
        delay_ms: int | None,
        in_flight: str,
        dedupe: Dedupe | None,
    ) -> int | Message[Any] | None:
        """Send one prepared message (a retry through :meth:`_redeliver`); its errors
        become the package's. Returns what :meth:`_send` returns."""
        due: int | Message[Any] | None = None
        try:
            if in_flight:
                due = self._redeliver(keys, message, sort_key, delay_ms, in_flight, dedupe)
            else:
                due = self._send(keys, message, sort_key, delay_ms, dedupe=dedupe)
        except redis.exceptions.OutOfMemoryError as e:
            if not in_flight:
                raise memory_full_error(self.client, e, enqueued=[], failed=[message], unknown=[]) from e
            # A retry refused by a full server would be lost once the worker acks the
            # message: let it take the place of the copy being processed instead.
            try:
                due = self._send(keys, message, sort_key, delay_ms, replacing=in_flight, dedupe=dedupe)
            except redis.exceptions.OutOfMemoryError as again:
                raise memory_full_error(self.client, again, enqueued=[], failed=[message], unknown=[]) from again
            self.logger.warning(
                "Server full: the retry of message %r took the place of its copy in flight on queue %r.",
                message.message_id,
                keys.queue_name,
            )
        except redis.ResponseError as e:
            if is_permission_error(e):
                self._explain_permissions(keys, e)
            raise
        except NotReplicated as e:
            self.register_queue(keys)
            raise not_replicated_error(e, enqueued=[message], failed=[], unknown=[]) from e
        self.register_queue(keys)
        return due

    def _emit_before_enqueue(self, message: Message[Any], delay: Any, eta: int | None) -> None:
        """Emit the ``before_enqueue`` hook on a delayed message with an ``eta`` option, as
        the built-in broker hands it (now + delay; after the send, the stored due time).
        The option is taken off again before the message is encoded: the stored and
        transferred copies carry none (a Worker would delay them again)."""
        if eta is None:
            self.emit_before("enqueue", message, delay)
            return
        message.options["eta"] = eta
        try:
            self.emit_before("enqueue", message, delay)
        finally:
            message.options.pop("eta", None)

    def _send(
        self,
        keys: QueueKeys,
        message: Message[Any],
        sort_key: str,
        delay_ms: int | None,
        replacing: str = "",
        dedupe: Dedupe | None = None,
    ) -> int | Message[Any] | None:
        """One prepared message: offered when delayed (with its ``dedupe`` key, mode and
        ttl), else pushed (unless already there). Returns the due time the offer stored
        (epoch ms, server clock), ``None`` (immediate, or a message that had already come
        due and moved), or the message holding its dedupe key (nothing was written)."""
        scripts = self.scripts
        lane = self.lane(message)
        if delay_ms:
            data = encode_scheduled(message, sort_key)
            if lane != PLAIN_LANE:
                # Laned (flow control): the full offer records the lane (offer_one stays plain).
                entry = (delay_ms, sort_key, message.message_id, data, "", *(dedupe or ("", "", 0)))
                (due,) = scripts.offer(keys, [entry], replacing=replacing, lanes=[lane])
                if isinstance(due, list):
                    return kept_message(due, base_queue(keys.queue_name))
                return int(due) if int(due) >= 0 else None
            if not dedupe and not replacing:
                # The common send: a fresh message, no key (offer_one.lua); a reschedule of a
                # scheduled message id (-4, nothing written) goes through the full offer.
                due = scripts.offer_one(
                    keys, delay_ms, sort_key, message.message_id, data, self._resend_lookup(delay_ms)
                )
                if due != -4:
                    return due if due >= 0 else None
            entry = (delay_ms, sort_key, message.message_id, data, "", *(dedupe or ("", "", 0)))
            (due,) = scripts.offer(keys, [entry], replacing=replacing)
            if isinstance(due, list):
                return kept_message(due, base_queue(keys.queue_name))
            return int(due) if int(due) >= 0 else None
        redis_id = message.options["redis_message_id"]
        reply = scripts.enqueue(
            keys, [(redis_id, message.encode(), lane)], self.host.settings.dedupe_window, replacing=replacing
        )
        pushed = int(reply[1])
        if not pushed:
            self._log_duplicates(keys.queue_name, [redis_id])
        return None

    def lane(self, message: Message[Any]) -> str:
        """The message's lane (flow control, see :mod:`dramatiq_redisson.flow._lanes`): from its options, or its
        actor's when this process declared the actor. Raises ValueError on a bad option."""
        actor = self.host.actors.get(message.actor_name)
        defaults = actor.options if actor is not None else {}
        return message_lane(message.options, defaults, self.host.settings.max_priority)

    def _resend_lookup(self, delay_ms: int) -> str:
        """Where offer_one.lua looks for a resent member that already came due: nowhere
        ("") when the delay outlasts every automatic retry of the call by the client (and
        :data:`RESEND_MARGIN_MS`): the member cannot have moved before a resend of this
        call runs, and the payload hash then tells a resend (one command less per send)."""
        span = self.retry_span
        if span is not None and delay_ms > span + RESEND_MARGIN_MS:
            return ""
        return self.resend_lookup

    def _log_duplicates(self, queue_name: str, redis_ids: list[str]) -> None:
        self.logger.info(
            "Not enqueued again on queue %r, already there (queued, in flight or sent within the last %d ms): %s",
            queue_name,
            self.host.settings.dedupe_window,
            ", ".join(redis_ids),
        )

    def _explain_permissions(self, keys: QueueKeys, error: redis.ResponseError) -> None:
        """A send was refused by ACL: raise one :class:`MissingPermission` naming everything
        the user lacks (returns when the probe finds nothing missing)."""
        host = self.host
        try:
            check_permissions(
                cast("redis.Redis", self.client),  # the broker's, a Redis or a RedisCluster
                keys,
                worker_id=self.worker_id,
                subscribe=False,
                wait_for_replicas=bool(host.settings.wait_for_replicas),
                server_version=host.server_version,
            )
        except MissingPermission as missing:
            raise missing from error
        except redis.RedisError:
            pass

    def forget_queue(self, queue_name: str) -> None:
        """The queue was flushed (it left the registry): list it again at its next send."""
        self.registered.discard(queue_name)

    def register_queue(self, keys: QueueKeys) -> None:
        """List a queue this process sends to in the namespace's queue registry, once per
        process (consumers' heartbeats list theirs), so that operators' tools and metrics
        see queues nobody consumes yet: their overdue messages are the ones to alert on."""
        if keys.queue_name in self.registered:
            return
        self.registered.add(keys.queue_name)
        try:
            self.client.sadd(keys.registry, keys.queue_name)
        except redis.RedisError as e:
            self.logger.debug("Could not list queue %r in %r: %s", keys.queue_name, keys.registry, e)

    # -- a retry (a message being processed, re-enqueued) ----------------------------

    def _redelivery_delay(self, message: MessageProxy, delay: Any) -> int | None:
        """The delay for re-enqueueing a message that is being processed (Retries does
        this, with ``Retry(delay=…)`` from user code).

        Raising here would lose the message: the middleware logs the error and the
        worker acks it. So a delay that cannot be honoured at all marks the message
        failed, so it ends in the dead letters, and then raises.
        """
        try:
            return validate_delay(delay)
        except (TypeError, ValueError):
            self.logger.error(
                "Cannot re-enqueue message %r with delay %r; moving it to the dead letters.", message.message_id, delay
            )
            message.fail()
            raise

    def _retry_dedupe(self, message: MessageProxy, delay_ms: int | None) -> Dedupe | None:
        """The dedupe key of a retry (a message being processed, re-enqueued): it holds
        the key like the original (mode "retry", see offer.lua). Never raises (that would
        lose the message): a retry without a delay, or with options another producer set
        wrongly, goes without its key."""
        if not delay_ms:
            return None
        try:
            found = dedupe_options(message.options, delay_ms)
        except ValueError as e:
            self.logger.warning("Retry of message %r is scheduled without its dedupe key: %s", message.message_id, e)
            return None
        return None if found is None else (found[0], "retry", found[2])

    def _redeliver(
        self,
        keys: QueueKeys,
        message: Message[Any],
        sort_key: str,
        delay_ms: int | None,
        in_flight: str,
        dedupe: Dedupe | None = None,
    ) -> int | Message[Any] | None:
        """Re-enqueue a message being processed, retrying through a lost connection, a
        restarting or loading server, for up to :data:`REDELIVERY_RETRY_TIME`.

        The worker acks the copy in flight right after this returns, so a retry that
        raised here would be lost (Dramatiq logs the middleware's error and acks). Sending
        the same prepared message again is safe: an offer of the same member schedules it
        once, and an immediate copy is pushed once (enqueue.lua). If the server stays away,
        the copy in flight is released instead: the consumer does not ack it, and requeues
        it from its ack set once the server is back. Returns what :meth:`_send` returns."""
        deadline = time.monotonic() + REDELIVERY_RETRY_TIME / 1000
        attempts = 0
        while True:
            try:
                due = self._send(keys, message, sort_key, delay_ms, dedupe=dedupe)
                if isinstance(due, Message):
                    self.logger.info(
                        "Retry of message %r dropped: its dedupe key %r is held by scheduled message %r.",
                        message.message_id,
                        dedupe[0] if dedupe else None,
                        due.message_id,
                    )
                if attempts:
                    self.logger.info("Re-enqueued message %r after %d attempts.", message.message_id, attempts + 1)
                return due
            except (redis.ConnectionError, redis.TimeoutError, NotReplicated) as e:
                # BusyLoadingError, MasterNotFoundError (a Sentinel failover) are
                # ConnectionErrors. NotReplicated: the retry is on the primary but too few
                # replicas have it; sending it again is safe, and acking the copy in
                # flight before a replica has the retry could lose both in a failover.
                if time.monotonic() >= deadline:
                    self.held.release(keys.queue_name, in_flight)
                    self.logger.error(
                        "Could not re-enqueue message %r on queue %r (%s); its copy in flight will be requeued "
                        "instead of acked.",
                        message.message_id,
                        keys.queue_name,
                        e,
                    )
                    raise
                if not attempts:
                    self.logger.warning(
                        "Re-enqueueing message %r on queue %r failed (%s); retrying.",
                        message.message_id,
                        keys.queue_name,
                        e,
                    )
                attempts, backoff_ms = compute_backoff(attempts, factor=100, max_backoff=MAX_REDELIVERY_BACKOFF)
                time.sleep(min(backoff_ms / 1000, max(0.0, deadline - time.monotonic())))

    # -- many messages -------------------------------------------------------------

    def enqueue_many(self, messages: Iterable[Message[Any]], delay: Any) -> list[Message[Any]]:
        """:meth:`RedissonBroker.enqueue_many` (see there)."""
        settings = self.host.settings
        delay_ms = validate_delay(delay)
        messages = list(messages)
        lanes = [self.lane(m) for m in messages]  # checked before anything is written
        dedupes = [dedupe_options(m.options, delay_ms) for m in messages]
        for message in messages:
            self.option_names.check(message, self.host)
        if delay_ms:
            sort_keys = next_sort_keys(len(messages))
            prepared = [prepare_scheduled(m, key)[0] for m, key in zip(messages, sort_keys, strict=True)]
        else:
            sort_keys = [""] * len(messages)
            prepared = [prepare(m, None)[0] for m in messages]
        estimate = eta_estimate(delay_ms)
        self.check_server()
        if self._hooked("before_enqueue"):
            for message in prepared:
                self._emit_before_enqueue(message, delay, estimate)
        targets = self.route_many([(m.queue_name, m.options) for m in prepared], BULK_CHUNK_SIZE)
        packed = pack(prepared, sort_keys, dedupes, delay_ms, self.keys, lanes=lanes, targets=targets)
        if packed.scheduled:
            outcomes = self.scripts.offer_calls(packed.scheduled)
        elif packed.ready:
            outcomes = self.scripts.enqueue_bulk(packed.ready, settings.dedupe_window)
        else:
            outcomes = []
        for queue_name in dict.fromkeys(targets):
            self.register_queue(self.keys(queue_name))
        outcome = sort_outcomes(packed, outcomes, delay_ms)
        for first, count, pushed in outcome.duplicates:
            self.logger.info(
                "%d of %d messages were not enqueued again on queue %r, already there "
                "(queued, in flight or sent within the last %d ms).",
                count - pushed,
                count,
                prepared[first].queue_name,
                settings.dedupe_window,
            )
        if estimate is not None:
            # Each message's eta: the due time its call stored, else (not known to be
            # scheduled) the estimate.
            for i, message in enumerate(prepared):
                message.options["eta"] = outcome.dues.get(i, estimate)
        if self._hooked("after_enqueue"):
            for i in outcome.enqueued:
                self.emit_after("enqueue", prepared[i], delay)
        for i, holder in outcome.kept.items():
            prepared[i] = holder
        if outcome.errors:
            raise enqueue_error(self.client, prepared, outcome)
        replicas = outcomes.replicas if isinstance(outcomes, Outcomes) else None
        if settings.wait_for_replicas and outcomes and (replicas is None or replicas < settings.wait_for_replicas):
            error = NotReplicated.describe(
                f"Enqueueing {len(prepared)} message(s)",
                replicas,
                settings.wait_for_replicas,
                settings.wait_timeout,
            )
            raise not_replicated_error(error, enqueued=[prepared[i] for i in outcome.enqueued], failed=[], unknown=[])
        return prepared
