"""Running now: the messages in flight on a queue, with their worker and fetch time.

fetch.lua (and a transfer's hand-off) record ``"<fetch ms>|<worker id>|<consumer token>"``
for each message it hands out in ``redisson_delay_queue_fetched:{N}``; ack, nack, requeue
and the recovery of a dead worker's messages delete the record. A listing keeps only the
records whose message is still in its worker's ack set and still has its data, so a record
left behind by something else (the built-in broker's maintenance in a mixed fleet) never
shows.

A message counts from its fetch: one waiting in a worker's prefetch (Dramatiq's worker
takes up to twice its threads) shows too, its age counting from when it was fetched.

Its progress is the last :func:`dramatiq_redisson.progress.report` of the message (keyed by
message id: a later run of it shows the earlier run's report until it reports again), read
in the same round trip as the ack sets.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypedDict, cast

from dramatiq.message import Message

from .._message import epoch_ms
from .._progress import decode_progress

if TYPE_CHECKING:
    from collections.abc import Callable

    from .._keys import QueueKeys


class RunningMessage(TypedDict):
    """One message in flight."""

    queue: str
    #: The message id (``send()``'s ``message_id``).
    message_id: str
    #: The id of the message's entry in the ready queue and the worker's ack set.
    redis_message_id: str
    #: The actor's name, or None when the stored message does not decode.
    actor: str | None
    #: The broker id of the worker process (its ack set is named after it).
    worker_id: str
    #: The host and pid of the worker process, from its consumer token.
    host: str | None
    pid: int | None
    #: The consumer token (``host:pid:broker-id:n``) that fetched it.
    consumer: str
    #: When it was fetched, epoch ms, server clock; and how long ago.
    fetched_ms: int
    age_ms: int
    #: Its last reported progress, from 0 to 1, and note (None: it reported none).
    progress: float | None
    note: str | None
    #: When it last reported (epoch ms, the server's clock as its worker knew it), or None.
    reported_ms: int | None


def running(client: Any, keys: Callable[[str], QueueKeys], queue_names: list[str]) -> list[RunningMessage]:
    """The messages in flight on ``queue_names`` (``keys``: a queue's keys), oldest first."""
    with client.pipeline(transaction=False) as pipe:
        for name in queue_names:
            pipe.hgetall(keys(name).fetched)
        replies = pipe.execute()
    now_ms = epoch_ms(cast("tuple[int, int]", client.time()))
    candidates: list[tuple[str, str, int, str, str]] = []
    for name, records in zip(queue_names, cast("list[dict[bytes, bytes]]", replies), strict=True):
        for raw_id, record in records.items():
            fetched, _, rest = record.decode(errors="replace").partition("|")
            worker_id, _, token = rest.partition("|")
            token = token.partition("|")[0]  # flow control adds "|held" and "|lane:<lane>"
            if fetched.isdigit() and worker_id:
                candidates.append((name, raw_id.decode(errors="replace"), int(fetched), worker_id, token))
    if not candidates:
        return []
    ack_sets = sorted({(name, worker_id) for name, _, _, worker_id, _ in candidates})
    reporting = sorted({name for name, *_ in candidates})
    with client.pipeline(transaction=False) as pipe:
        for name, worker_id in ack_sets:
            pipe.smembers(keys(name).acks(worker_id))
        for name in reporting:
            pipe.hgetall(keys(name).progress)
        for name, redis_id, *_ in candidates:
            pipe.hget(keys(name).ready_msgs, redis_id)
        replies = pipe.execute()
    members = {
        key: {m.decode(errors="replace") for m in cast("set[bytes]", ack_set)}
        for key, ack_set in zip(ack_sets, replies, strict=False)
    }
    reports = dict(zip(reporting, cast("list[dict[bytes, bytes]]", replies[len(ack_sets) :]), strict=False))
    found: list[RunningMessage] = []
    datas = replies[len(ack_sets) + len(reporting) :]
    for (name, redis_id, fetched_ms, worker_id, token), data in zip(candidates, datas, strict=True):
        if data is None or redis_id not in members[(name, worker_id)]:
            continue
        message_id, actor = _describe(cast("bytes", data), redis_id)
        host, pid = _host_pid(token)
        report = reports[name].get(message_id.encode())
        progress = decode_progress(report) if report is not None else None
        found.append(
            RunningMessage(
                queue=name,
                message_id=message_id,
                redis_message_id=redis_id,
                actor=actor,
                worker_id=worker_id,
                host=host,
                pid=pid,
                consumer=token,
                fetched_ms=fetched_ms,
                age_ms=max(0, now_ms - fetched_ms),
                progress=progress[0] if progress else None,
                note=progress[2] if progress else None,
                reported_ms=progress[1] if progress else None,
            )
        )
    found.sort(key=lambda m: (m["fetched_ms"], m["queue"], m["redis_message_id"]))
    return found


def _describe(data: bytes, redis_id: str) -> tuple[str, str | None]:
    """The message id and actor of a stored message (the redis id when it does not decode)."""
    try:
        message: Message[Any] = Message.decode(data)
    except Exception:
        return redis_id, None
    return message.message_id, message.actor_name


def _host_pid(token: str) -> tuple[str | None, int | None]:
    parts = token.split(":")
    if len(parts) != 4:
        return None, None
    return parts[0] or None, int(parts[1]) if parts[1].isdigit() else None
