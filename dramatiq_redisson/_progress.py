"""Long jobs: the middleware behind :mod:`dramatiq_redisson.progress`, and how a message's
progress and checkpoint are kept.

Two HASHes per queue (a sharded queue's shard), in the queue's slot (see :mod:`._keys`):
``progress`` maps a message id to ``"<fraction>|<epoch ms>|<note>"`` (the last report; the
time is the server's clock as the worker estimates it from its last transfer, else the
worker's), ``checkpoints`` maps it to the JSON state it saved. Both are keyed by message
id, which a retry and an interruption keep, so a later run of the message finds them.

What :class:`LongJobs` does, hook by hook:

- **before a message runs**: it becomes this thread's :class:`Run` (no command);
- **after it ran**, an :class:`Interrupted` message (which ``Retries`` puts back at once,
  as it does any ``Retry``): its ``retries`` option is lowered by one before ``Retries``
  raises it again, so the copy put back has the count the run started with and is put
  back even on its last retry. This middleware sits after ``Retries`` in the list, so its
  ``after_`` hooks run first (Dramatiq runs them in reverse order). Without ``Retries``, it
  puts the message back itself;
- **on its ack** after a run that raised nothing (it succeeded), or **on its nack** (it is
  dead-lettered): one pipeline of two ``HDEL``, only if the run reported, checkpointed or
  resumed. A run that raised and is acked was put back (a retry, an interruption): its
  state stays for the next run;
- **when its Worker is told to stop** (``before_worker_shutdown``): :func:`should_stop
  <dramatiq_redisson.progress.should_stop>` turns True on that Worker's threads.

A message that calls none of :mod:`dramatiq_redisson.progress` costs no command.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Set
from typing import Any, Protocol, cast

import redis
from dramatiq.broker import Broker
from dramatiq.errors import Retry
from dramatiq.middleware import Middleware, Retries

from ._held import HeldMessages
from ._keys import QueueKeys
from ._logs import logger_for
from .connection._commands import Commands

#: The message option that counts its retries (``Retries`` keeps it).
RETRY_COUNT = "retries"


class Interrupted(Retry):
    """Raised by an actor to put its message back on its queue at once, to run again
    (and resume from its last checkpoint) on another worker. It is neither a failure nor
    a retry: the message's ``retries`` count stays as it was, nothing is logged as an
    error, and it is put back even when its retries are used up.

    An actor's ``throws`` must not cover it (``throws=Exception`` would fail the message),
    and a ``retry_when`` predicate must return True for it.
    """

    def __init__(self, message: str = "interrupted: the message runs again from its last checkpoint") -> None:
        super().__init__(message, delay=0)


class ClockHost(Protocol):
    """What a run reads of the broker's scripts: the server clock estimate."""

    def server_now_ms(self, queue_name: str) -> str: ...


class ProgressHost(Protocol):
    """What a :class:`Run` reads of its broker."""

    client: Commands
    held: HeldMessages
    redisson_scripts: ClockHost

    def keys(self, queue_name: str) -> QueueKeys: ...


def encode_progress(fraction: float, at_ms: int, note: str | None) -> str:
    """A progress record: ``"<fraction>|<epoch ms>|<note>"`` (the note last: it may hold ``|``)."""
    return f"{fraction!r}|{at_ms}|{note or ''}"


def decode_progress(record: bytes | str) -> tuple[float, int, str | None] | None:
    """The fraction, time (epoch ms) and note of a progress record, or None when it is not one."""
    text = record.decode(errors="replace") if isinstance(record, bytes) else record
    fraction, _, rest = text.partition("|")
    at_ms, _, note = rest.partition("|")
    try:
        return float(fraction), int(at_ms), note or None
    except ValueError:
        return None


class Run:
    """One run of a message on a worker thread, as :mod:`dramatiq_redisson.progress` and
    :class:`LongJobs` see it."""

    def __init__(self, host: ProgressHost, message: Any, worker: int, stopping: Set[int]) -> None:
        self.host = host
        self.message = message
        #: The Worker whose thread runs it (the id of its work queue), and the Workers told to stop.
        self.worker = worker
        self.stopping = stopping
        #: It reported, checkpointed or resumed: its end clears what it kept.
        self.used = False
        #: It raised (a retry or an interruption follows, or a failure).
        self.raised = False
        self._keys: QueueKeys | None = None

    @property
    def message_id(self) -> str:
        return str(self.message.message_id)

    @property
    def keys(self) -> QueueKeys:
        """Its queue's keys: a sharded queue's, the shard it was fetched from (a retry
        goes back to that shard)."""
        if self._keys is None:
            redis_message_id = self.message.options.get("redis_message_id")
            queue = self.host.held.queue_of(redis_message_id) if redis_message_id else None
            self._keys = self.host.keys(queue or self.message.queue_name)
        return self._keys

    def should_stop(self) -> bool:
        return self.worker in self.stopping

    def report(self, fraction: float, note: str | None) -> None:
        """Keep its progress (one ``HSET``)."""
        keys = self.keys
        self.used = True
        now = self.host.redisson_scripts.server_now_ms(keys.queue_name)
        at_ms = int(now) if now else int(time.time() * 1000)
        self.host.client.hset(keys.progress, self.message_id, encode_progress(fraction, at_ms, note))

    def checkpoint(self, state: bytes) -> None:
        """Keep its state (one ``HSET``)."""
        keys = self.keys
        self.used = True
        self.host.client.hset(keys.checkpoints, self.message_id, state)

    def resume(self) -> bytes | None:
        """Its last state (one ``HGET``), or None."""
        keys = self.keys
        self.used = True
        state = self.host.client.hget(keys.checkpoints, self.message_id)
        return state if isinstance(state, bytes) else None

    def clear(self) -> None:
        """Drop its progress and state (one round trip)."""
        keys = self.keys
        with self.host.client.pipeline(transaction=False) as pipe:
            pipe.hdel(keys.progress, self.message_id)
            pipe.hdel(keys.checkpoints, self.message_id)
            pipe.execute()


#: This thread's run (set before a message runs, dropped at its ack or nack).
_local = threading.local()


def current_run() -> Run | None:
    """The run of the message this thread is processing, or None."""
    return getattr(_local, "run", None)


def add_long_jobs(broker: Broker) -> None:
    """Add :class:`LongJobs` to ``broker``, after ``Retries`` when there is one (its
    ``after_process_message`` must run before Retries': see the module); not twice."""
    if any(isinstance(m, LongJobs) for m in broker.middleware):
        return
    retries = next((type(m) for m in broker.middleware if isinstance(m, Retries)), None)
    broker.add_middleware(LongJobs(), after=retries)


class LongJobs(Middleware):
    """Tracks the message each worker thread runs for :mod:`dramatiq_redisson.progress`,
    restores the retry count of an interrupted one, clears what a finished one kept, and
    notes Workers told to stop (see the module)."""

    def __init__(self) -> None:
        self.logger = logger_for(type(self))
        #: The Workers told to stop, by the id of their work queue (a worker thread's ``work_queue``).
        self._stopping: set[int] = set()

    def before_worker_shutdown(self, broker: Broker, worker: Any) -> None:
        self._stopping.add(id(getattr(worker, "work_queue", None)))

    def after_worker_shutdown(self, broker: Broker, worker: Any) -> None:
        self._stopping.discard(id(getattr(worker, "work_queue", None)))

    def before_process_message(self, broker: Broker, message: Any) -> None:
        worker = id(getattr(threading.current_thread(), "work_queue", None))
        _local.run = Run(cast("ProgressHost", broker), message, worker, self._stopping)

    def after_process_message(
        self, broker: Broker, message: Any, *, result: Any = None, exception: BaseException | None = None
    ) -> None:
        run = current_run()
        if run is None or run.message is not message or exception is None:
            return
        run.raised = True
        if not isinstance(exception, Interrupted):
            return
        if any(isinstance(m, Retries) for m in broker.middleware):
            # Retries adds one and checks the count against max_retries: it sees one less,
            # so the copy it puts back has the count this run started with.
            message.options[RETRY_COUNT] = message.options.get(RETRY_COUNT, 0) - 1
            return
        self.logger.info("Putting interrupted message %r back.", message.message_id)
        broker.enqueue(message, delay=0)

    def after_ack(self, broker: Broker, message: Any) -> None:
        run = self._finished(message)
        if run is not None and not run.raised:
            self._clear(run)

    def after_nack(self, broker: Broker, message: Any) -> None:
        run = self._finished(message)
        if run is not None:
            self._clear(run)

    def _finished(self, message: Any) -> Run | None:
        """This thread's run of ``message``, which ends now; None when it used nothing."""
        run = current_run()
        if run is None or run.message is not message:
            return None
        _local.run = None
        return run if run.used else None

    def _clear(self, run: Run) -> None:
        try:
            run.clear()
        except (redis.RedisError, OSError) as e:
            self.logger.warning(
                "Could not clear the progress and checkpoint of message %r (%s); they stay until its queue is flushed.",
                run.message_id,
                e,
            )
