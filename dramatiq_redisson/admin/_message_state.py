"""A message's state, found by its message id (issue 58): :func:`message_state`, behind
``broker.message_state``.

Each queue (each shard of a sharded queue) answers with one call of ``scripts/lua/state.lua``,
which says where the message is on that queue and how it was found (its header lists the
lookups, what each costs, and what a search cannot find). With a queue named, that is one
call per shard, with the search; on one server, one round trip. Without one, every known
queue is asked in one round of direct lookups first (no search: a message sent without a
delay, or scheduled, is found there); only when none knows the message, a second round
searches every queue. No index is kept for it: a send pays nothing for this.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypedDict

from dramatiq.message import Message

from .._message import decode_scheduled
from .._progress import decode_progress
from .._queue_names import base_queue
from .._settings import is_int
from ..scripts._contract import contract
from ._running import _host_pid

if TYPE_CHECKING:
    from .._keys import QueueKeys
    from ..connection._topology import Topology
    from ..scripts._calls import Scripts

#: How many ids state.lua's search reads at each end of the message's lane, and of the
#: newest dead letters. A search that reads them all (a lane of 100 000 ids, 10 000 dead
#: letters, 1 000 messages in flight) takes the server about 2.3 ms (Valkey 9.1, measured
#: with SLOWLOG); the direct lookups about 11 µs. Larger searches cost in proportion.
SEARCH_LIMIT = 2_000

#: The states a message can be in. "failed": it failed and a retry of it is scheduled (a
#: scheduled message whose ``retries`` option is above 0); "unknown": no queue holds
#: anything of it (never sent, cancelled, its dead letter or done record expired, or a
#: place the search does not reach: see ``complete``).
STATES = ("scheduled", "ready", "running", "done", "failed", "dead", "unknown")

#: The state.lua states of a live copy, the first found winning.
_LIVE = ("scheduled", "running", "ready")


class MessageState(TypedDict):
    """Where one message is (:meth:`RedissonBroker.message_state`). Times are epoch ms on the
    server's clock unless said otherwise; a field that does not apply to the state is None."""

    message_id: str
    #: One of :data:`STATES`.
    state: str
    #: Its queue (a sharded queue's name, not its shard's).
    queue: str | None
    #: The id of its entry on the server (its member while scheduled, the redis id of its
    #: copy in the ready queue, in flight or dead).
    redis_message_id: str | None
    actor: str | None
    #: How many times it has failed so far (its ``retries`` option), when its data is there.
    retries: int | None
    #: When it was sent: its ``message_timestamp`` (the producer's clock).
    sent_ms: int | None
    #: Scheduled or failed: when it (its retry) is due.
    due_ms: int | None
    #: Running: when its worker fetched it.
    started_ms: int | None
    #: Done: when its ack finished it; dead: when it died.
    finished_ms: int | None
    #: Running: the worker process (its broker id, host and pid).
    worker_id: str | None
    host: str | None
    pid: int | None
    #: Its last progress report (:func:`dramatiq_redisson.progress.report`), from 0 to 1, and
    #: its note and time (the server's clock as its worker knew it); kept from run to run
    #: until it succeeds or dies.
    progress: float | None
    note: str | None
    reported_ms: int | None
    #: The server's clock when it was read.
    time_ms: int
    #: False when a search read only part of a long lane or of the dead letters and found
    #: nothing there: an "unknown" (or "dead", "done") may then be a copy it did not reach.
    complete: bool
    #: The message as stored (None: done, unknown, or its data does not decode).
    message: Message[Any] | None


class QueueNames(Protocol):
    """What :func:`message_state` reads of the broker's read side (its ``QueueAdmin``)."""

    def known(self, queue_name: str, *, among: list[str] | None = None) -> str: ...

    def known_queues(self) -> list[str]: ...

    def internal_names(self, queue_names: list[str]) -> dict[str, list[str]]: ...


class StateHost(Protocol):
    """What :func:`message_state` reads of its broker."""

    topology: Topology
    redisson_scripts: Scripts

    @property
    def admin(self) -> QueueNames: ...

    def keys(self, queue_name: str) -> QueueKeys: ...


def message_state(
    host: StateHost, message_id: str, queue_name: str | None = None, *, search: int = SEARCH_LIMIT
) -> MessageState:
    """Where the message ``message_id`` is: its state (``"scheduled"``, ``"ready"``,
    ``"running"``, ``"done"``, ``"failed"`` (a retry is scheduled), ``"dead"`` or
    ``"unknown"``), its queue, its times (sent, due, started, finished: those that apply),
    its retries, and its last progress report and note.

    ``queue_name``: look on that queue only, one call of ``state.lua`` (one per shard of a
    sharded queue), which looks the message up directly and, when that finds nothing,
    searches for a copy moved from the delayed queue (see ``scripts/lua/state.lua``).
    Without it: one round of direct lookups over every known queue, then, if none knows
    it, one round that searches them all. ``search``: how many ids a search reads at each
    end of a lane and of the newest dead letters (0: the direct lookups alone).

    "done" needs the broker's ``done_retention``: without it a processed message is
    "unknown". A retry sent without a delay is not found while it is ready, running or dead
    (its redis id is a fresh uuid); a moved message far inside a long lane may not be found
    either: ``complete`` is then False.

    Raises:
      ValueError: ``message_id`` is not a non-empty string, ``search`` not a non-negative
        int, or ``queue_name`` not a known queue.
    """
    if not isinstance(message_id, str) or not message_id:
        raise ValueError(f"message_id must be a non-empty string, got {message_id!r}")
    if not is_int(search) or search < 0:
        raise ValueError(f"search must be a non-negative int, got {search!r}")
    admin = host.admin
    if queue_name is not None:
        name = admin.known(queue_name)
        return _ask(host, message_id, admin.internal_names([name])[name], search)
    names = [internal for shards in admin.internal_names(admin.known_queues()).values() for internal in shards]
    found = _ask(host, message_id, names, 0)
    if found["state"] == "unknown" and search > 0 and names:
        found = _ask(host, message_id, names, search)
    return found


def _ask(host: StateHost, message_id: str, names: Sequence[str], search: int) -> MessageState:
    """state.lua on each of ``names`` (internal queue names), in one round; the best answer."""
    scripts = host.redisson_scripts

    def call(name: str) -> Callable[[Any], Any]:
        return lambda client: scripts.message_state(host.keys(name), message_id, search, client=client)

    if not names:
        return _unknown(message_id, _server_ms(host), complete=True)
    replies = host.topology.each([call(name) for name in names])
    slots = [(name, contract("state").reply(reply)) for name, reply in zip(names, replies, strict=True)]
    complete = all(int(reply["complete"]) for _, reply in slots)
    name, best = min(slots, key=lambda pair: _rank(pair[1]))
    return _read(message_id, name, best, complete)


def _rank(reply: dict[str, Any]) -> tuple[int, int]:
    """Which answer wins: a live copy (scheduled, running, ready), then the latest dead
    letter or done record, then unknown."""
    state = reply["state"].decode()
    if state in _LIVE:
        return (_LIVE.index(state), 0)
    if state in ("dead", "done"):
        return (len(_LIVE), -int(reply["at_ms"]))
    return (len(_LIVE) + 1, 0)


def _read(message_id: str, name: str, reply: dict[str, Any], complete: bool) -> MessageState:
    """A :class:`MessageState` from state.lua's reply on internal queue ``name``."""
    state = reply["state"].decode()
    now_ms, at_ms = int(reply["now_ms"]), int(reply["at_ms"])
    found = _unknown(message_id, now_ms, complete)
    report = decode_progress(reply["progress"]) if reply["progress"] else None
    if report is not None:
        found["progress"], found["reported_ms"], found["note"] = report
    if state == "unknown":
        return found
    queue = base_queue(name)
    redis_id = reply["redis_message_id"].decode() or None
    message = _decode(state, redis_id, reply["data"], queue)
    found["queue"], found["redis_message_id"], found["message"] = queue, redis_id, message
    if message is not None:
        found["actor"] = message.actor_name
        found["retries"] = retries = int(message.options.get("retries", 0) or 0)
        stamp = message.message_timestamp
        found["sent_ms"] = stamp if isinstance(stamp, int) else None
        if state == "scheduled" and retries:
            state = "failed"
    found["state"] = state
    if state in ("scheduled", "failed"):
        found["due_ms"] = at_ms if at_ms >= 0 else None
    elif state in ("done", "dead"):
        found["finished_ms"] = at_ms
    elif state == "running":
        fetched, _, rest = reply["record"].decode(errors="replace").partition("|")
        worker_id, _, token = rest.partition("|")
        found["started_ms"] = int(fetched) if fetched.isdigit() else None
        found["worker_id"] = worker_id or None
        found["host"], found["pid"] = _host_pid(token.partition("|")[0])
    return found


def _decode(state: str, redis_id: str | None, data: bytes, queue_name: str) -> Message[Any] | None:
    """The message in ``data`` (a scheduled one's stored payload, else its encoding), or None."""
    if not data or redis_id is None:
        return None
    try:
        if state == "scheduled":
            return decode_scheduled(redis_id.encode(), data, queue_name)
        return Message.decode(data)
    except Exception:
        return None


def _unknown(message_id: str, now_ms: int, complete: bool) -> MessageState:
    return MessageState(
        message_id=message_id,
        state="unknown",
        queue=None,
        redis_message_id=None,
        actor=None,
        retries=None,
        sent_ms=None,
        due_ms=None,
        started_ms=None,
        finished_ms=None,
        worker_id=None,
        host=None,
        pid=None,
        progress=None,
        note=None,
        reported_ms=None,
        time_ms=now_ms,
        complete=complete,
        message=None,
    )


def _server_ms(host: StateHost) -> int:
    """The server's clock (epoch ms), when no queue was asked."""
    seconds, micros = host.topology.client.time()
    return int(seconds) * 1000 + int(micros) // 1000
