"""Long jobs that survive deploys: progress, checkpoints, and stopping on time.

Called from inside an actor that a :class:`~dramatiq_redisson.RedissonBroker` worker runs
(the broker adds the middleware these need when a worker boots)::

    from dramatiq_redisson import progress

    @dramatiq.actor(max_retries=3)
    def reindex(collection: str) -> None:
        state = progress.resume() or {"offset": 0}  # where an earlier run stopped
        total = count(collection)
        while state["offset"] < total:
            index_batch(collection, state["offset"], 1000)
            state["offset"] += 1000
            progress.checkpoint(state)
            progress.report(state["offset"] / total, f"{state['offset']} of {total}")
            if progress.should_stop():  # the worker is shutting down: a deploy
                raise progress.Interrupted()  # runs again elsewhere, from the checkpoint

- :func:`report` shows a fraction and a note in ``broker.running()``, the CLI's
  ``running`` and the dashboard's Running page;
- :func:`checkpoint` keeps a small JSON state for the message, which :func:`resume`
  returns when the message runs again (after a crash, a ``kill -9``, a retry, a deploy);
  both are dropped when the message succeeds or is dead-lettered;
- :func:`should_stop` is True once the worker has been told to shut down;
- ``raise Interrupted()`` puts the message back at once, neither a failure nor a retry.

Each call of :func:`report`, :func:`checkpoint` and :func:`resume` is one command; a message
that calls none of them costs nothing. See ``docs/deploys.md`` for the pattern.
"""

from __future__ import annotations

import json
import numbers
from typing import Any

import redis

from ._logs import logger_for
from ._progress import Interrupted, Run, current_run

__all__ = ["MAX_CHECKPOINT_BYTES", "MAX_NOTE_LENGTH", "Interrupted", "checkpoint", "report", "resume", "should_stop"]

#: The longest note :func:`report` keeps (characters).
MAX_NOTE_LENGTH = 200

#: The largest state :func:`checkpoint` keeps (bytes of its JSON, UTF-8).
MAX_CHECKPOINT_BYTES = 64 * 1024


def report(fraction: float, note: str | None = None) -> None:
    """Show how far the current message has got: ``fraction`` from 0 to 1, and an optional
    ``note`` (``"12 000 of 48 000 rows"``). The last report shows in ``broker.running()``
    (the CLI's ``running``, the dashboard's Running page) and in the message's state, until
    the message succeeds or is dead-lettered; a later run of the message (a retry, an
    interruption) shows it until it reports again. One command.

    A report the server does not take (it is away) is logged and dropped: it is for people
    to read, and the job goes on.

    Raises:
      ValueError: ``fraction`` is not a number from 0 to 1, or ``note`` is not a string of
        at most :data:`MAX_NOTE_LENGTH` characters; nothing is written.
      RuntimeError: Not called from an actor run by a worker of a ``RedissonBroker``.
    """
    # (NaN compares false with both bounds: refused too.)
    if isinstance(fraction, bool) or not isinstance(fraction, numbers.Real) or not 0 <= fraction <= 1:
        raise ValueError(f"progress.report: fraction must be a number from 0 to 1, got {fraction!r}")
    if note is not None and not isinstance(note, str):
        raise ValueError(f"progress.report: note must be a string or None, got {type(note).__name__}")
    if note is not None and len(note) > MAX_NOTE_LENGTH:
        raise ValueError(f"progress.report: note is {len(note)} characters long, at most {MAX_NOTE_LENGTH} are kept")
    run = _run("report")
    try:
        run.report(float(fraction), note)
    except (redis.RedisError, OSError) as e:  # a report is for people: the job goes on without it
        logger_for("progress").warning("Progress of message %r not reported (%s).", run.message_id, e)


def checkpoint(state: Any) -> None:
    """Keep ``state`` (anything JSON encodes: a dict of offsets and ids, not the data
    itself) for the current message, in place of the one kept before: :func:`resume`
    returns it when the message runs again. It is dropped when the message succeeds or is
    dead-lettered. One command, written to the server before this returns.

    Raises:
      ValueError: ``state`` is not JSON (NaN and infinities included), or its JSON is over
        :data:`MAX_CHECKPOINT_BYTES`; nothing is written.
      RuntimeError: Not called from an actor run by a worker of a ``RedissonBroker``.
      redis.RedisError: The server did not take it (the earlier checkpoint stays).
    """
    try:
        encoded = json.dumps(state, separators=(",", ":"), allow_nan=False).encode()
    except (TypeError, ValueError) as e:
        raise ValueError(f"progress.checkpoint: the state must be JSON ({e})") from None
    if len(encoded) > MAX_CHECKPOINT_BYTES:
        raise ValueError(
            f"progress.checkpoint: the state is {len(encoded)} bytes as JSON, at most {MAX_CHECKPOINT_BYTES} "
            "are kept: keep where the job is (offsets, ids) and its data elsewhere"
        )
    _run("checkpoint").checkpoint(encoded)


def resume() -> Any:
    """The last state :func:`checkpoint` kept for the current message (by this run or an
    earlier one: the message ran before and was retried, interrupted, or its worker
    died), or None when there is none. One command.

    Raises:
      RuntimeError: Not called from an actor run by a worker of a ``RedissonBroker``.
      redis.RedisError: The server could not be read.
    """
    state = _run("resume").resume()
    return None if state is None else json.loads(state)


def should_stop() -> bool:
    """Whether the worker running the current message has been told to shut down (its
    ``Worker.stop()`` began: under the ``dramatiq`` command, within a second of the
    SIGTERM or SIGHUP its worker process gets, which is how the command checks for them).
    Then the job should checkpoint and ``raise Interrupted()``. No command: call it as
    often as you like.

    Raises:
      RuntimeError: Not called from an actor run by a worker of a ``RedissonBroker``.
    """
    return _run("should_stop").should_stop()


def _run(call: str) -> Run:
    run = current_run()
    if run is None:
        raise RuntimeError(
            f"progress.{call}() must be called from inside an actor, on the thread a worker of a "
            "RedissonBroker runs it on: no message runs on this thread"
        )
    return run
