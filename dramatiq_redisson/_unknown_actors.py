"""Messages for an actor the worker that got them has not declared: put back for another.

During a rolling deploy the old processes run beside the new ones, and a message for an
actor the new release adds can reach an old process first. Dramatiq dead-letters such a
message at once (``ActorNotFound``). Here the consumer that got it puts it back on the
server instead, due again :data:`PUT_BACK_DELAY_MS` later, for whichever worker gets it
then; it never reaches Dramatiq's Worker, so it neither runs nor fails, and its retry
count stays as it was. After the broker's ``unknown_actor_grace`` (ms, counted from its
first put-back on the server's clock) it goes to Dramatiq after all, with a reason that
names the actor, and Dramatiq dead-letters it through the consumer's nack.

A put-back is a retry's re-enqueue that takes the place of its copy in flight: offer.lua's
``move:`` mode schedules the message and drops the copy's data in one call (see
``_producer.Producer._send`` with ``replacing``). requeue.lua then clears the copy's
entry in the worker's ack set and its fetch record, and gives back its concurrency slots:
with its data gone nothing is pushed, and nothing counts in the activity history. If the
worker dies between the two calls, the next requeue of its ack set does the same. A
counter in the queue's slot (``QueueKeys.counts``, field ``unknown_actor``) counts each
put-back for ``broker.stats()`` and the metrics.

A fleet where every process knows every actor never comes here: the consumer's one
check is a lookup in its broker's actors, and no script or command changes. Only a
Worker's consumers check: a consumer that other code iterates (``broker.consume(...)``)
hands out every message, as before.

The lease holder would take its own put-back back: a transfer hands what it moves to its
caller when jobs are short. So a consumer takes no hand-off from the transfer calls made
while one of its put-backs comes due (:meth:`UnknownActors.expects`), and the transfer
wakes other idle consumers for it instead.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

import redis
from dramatiq.message import Message

from ._keys import PLAIN_LANE
from ._message import encode_scheduled, prepare_scheduled

if TYPE_CHECKING:
    from ._held import HeldMessages
    from ._keys import QueueKeys
    from ._settings import BrokerSettings
    from .connection._commands import Commands
    from .scripts._calls import Scripts

#: How long (ms) a message is put back for. Long enough that a fleet of old processes
#: does not pass a message around in a busy loop (each put-back is four calls and one
#: transfer), short enough that once a process that knows the actor is up, the message
#: starts within about this long; a put-back is a delayed send, so a fleet's transfers
#: place it, with the rest, on an idle thread of any process.
PUT_BACK_DELAY_MS = 1000

#: The option a put-back message carries: when it was first put back (epoch ms, the
#: server's clock), kept across put-backs and processes; the grace counts from it.
SINCE_OPTION = "unknown_actor_since_ms"

#: The option a message that waited out the grace is dead-lettered with: why, naming the
#: actor. Its last line of ``traceback`` says the same (Dramatiq's Retries writes a failed
#: message's traceback there, and the CLI and the dashboard show that line as its error).
REASON_OPTION = "dead_reason"

#: The field of ``QueueKeys.counts`` that counts put-backs.
COUNT_FIELD = "unknown_actor"

#: A consumer's transfer calls from this long (ms, by its estimate of the server's clock)
#: before one of its put-backs is due, until a call finds it due, hand it nothing (see
#: :meth:`UnknownActors.expects`): the estimate runs a moment behind the server's.
DECLINE_LEAD_MS = 50


class UnknownActorsHost(Protocol):
    """What :class:`UnknownActors` reads of its broker: its actors (declared in this
    process), its settings (``unknown_actor_grace``, read at each put-back: it may be
    assigned), its scripts, its client and the held ids."""

    client: Commands
    held: HeldMessages
    redisson_scripts: Scripts

    @property
    def actors(self) -> Mapping[str, Any]: ...

    @property
    def settings(self) -> BrokerSettings: ...


class UnknownActors:
    """Puts back, or gives up on, the messages a consumer got for an actor its process has
    not declared (see the module).

    Parameters:
      host: The broker: its actors, ``unknown_actor_grace``, scripts (offer.lua,
        requeue.lua), client (the fetch record's HGET, the counter's HINCRBY) and held
        ids (a copy put back is no longer held).
      keys: The consumer's queue's keys (a sharded queue's shard).
      worker_id: The broker's id (its ack set).
      logger_name: The logger it logs to (its consumer's).
    """

    def __init__(self, host: UnknownActorsHost, keys: QueueKeys, *, worker_id: str, logger_name: str) -> None:
        self.host = host
        self.scripts = host.redisson_scripts
        self.client = host.client
        self.held = host.held
        self.keys = keys
        self.worker_id = worker_id
        self.logger = logging.getLogger(logger_name)
        #: When its put-backs are due (epoch ms, the server's clock), oldest first, until a
        #: transfer call finds them due (:meth:`passed`).
        self.dues: deque[int] = deque()

    def knows(self, actor_name: str) -> bool:
        """Whether this process declared ``actor_name`` (the one check on the common path)."""
        return actor_name in self.host.actors

    def expects(self, now_ms: int) -> bool:
        """Whether one of its put-backs comes due now (``now_ms``: an estimate of the
        server's clock, 0 without one). The consumer's transfer calls then take no
        hand-off: the lease holder would hand the message back to itself, a second later
        each time, while a worker that knows the actor idles. The transfer wakes other
        idle consumers for what it moves instead (never its caller)."""
        return bool(self.dues) and now_ms > 0 and self.dues[0] <= now_ms + DECLINE_LEAD_MS

    def passed(self, server_ms: int) -> None:
        """A transfer call ran at ``server_ms`` (the server's clock): the put-backs due by
        then have moved (or move at the lease holder's next call, which takes them)."""
        while self.dues and self.dues[0] <= server_ms:
            self.dues.popleft()

    def put_back(self, redis_message_id: str, message: Message[Any]) -> bool:
        """Put back ``message`` (fetched as ``redis_message_id``) for another worker, and
        return True; or, once its grace is over, mark it with the reason it is
        dead-lettered (:data:`REASON_OPTION`, ``traceback``) and return False: the caller
        hands it to Dramatiq, whose Worker dead-letters a message for an unknown actor.

        Raises what the calls raise (the server away, a refusal): the copy in flight may
        then be replaced already or not, and the caller leaves it to the next
        reconciliation of its ack set (see ``RedissonConsumer._put_back``)."""
        record = self.client.hget(self.keys.fetched, redis_message_id)
        fetched_ms, lane = _read_record(record)
        # (Every fetch and hand-off writes a record; without one, this host's clock.)
        now_ms = fetched_ms or int(time.time() * 1000)
        since = message.options.get(SINCE_OPTION)
        since_ms = since if isinstance(since, int) and not isinstance(since, bool) else now_ms
        grace = self.host.settings.unknown_actor_grace
        if now_ms - since_ms >= grace:
            self._give_up(message, now_ms - since_ms, grace)
            return False
        prepared, sort_key = prepare_scheduled(message.copy(options={SINCE_OPTION: since_ms}))
        entry = (PUT_BACK_DELAY_MS, sort_key, prepared.message_id, encode_scheduled(prepared, sort_key), "")
        (due,) = self.scripts.offer(self.keys, [entry], replacing=redis_message_id, lanes=[lane])
        if isinstance(due, int) and due > 0:
            self.dues.append(due)
        self.scripts.requeue(self.keys, self.worker_id, [redis_message_id])
        self.held.discard(self.keys.queue_name, (redis_message_id,))
        try:
            self.client.hincrby(self.keys.counts, COUNT_FIELD, 1)
        except redis.RedisError as e:  # the message is back; only the count is lost
            self.logger.debug("Could not count a put-back on queue %r: %s", self.keys.queue_name, e)
        log = self.logger.warning if since is None else self.logger.debug
        log(
            "Message %r is for actor %r, which this worker has not declared: put back on queue %r for "
            "another worker (%d of %d s waited).",
            message.message_id,
            message.actor_name,
            self.keys.queue_name,
            (now_ms - since_ms) // 1000,
            grace // 1000,
        )
        return True

    def _give_up(self, message: Message[Any], waited_ms: int, grace_ms: int) -> None:
        """Mark ``message`` with the reason it is dead-lettered (its options are what its
        dead letter keeps: see ``RedissonConsumer.nack``)."""
        reason = (
            f"no worker that got it knows actor {message.actor_name!r} "
            f"(waited {waited_ms // 1000} s; unknown_actor_grace is {grace_ms // 1000} s)"
        )
        options = message.options
        options.pop(SINCE_OPTION, None)  # a dead letter requeued by hand gets the grace anew
        options[REASON_OPTION] = reason
        previous = options.get("traceback")
        line = f"ActorNotFound: {reason}"
        options["traceback"] = f"{previous.rstrip()}\n\n{line}" if isinstance(previous, str) else line


def _read_record(record: bytes | str | None) -> tuple[int | None, str]:
    """A fetch record's time (epoch ms, the server's clock; None without a record) and the
    lane its message was fetched from (``"<ms>|<worker id>|<token>[|held][|lane:<lane>]"``:
    fetch.lua, transfer.lua)."""
    if not record:
        return None, PLAIN_LANE
    text = record if isinstance(record, str) else record.decode(errors="replace")
    head, _, _ = text.partition("|")
    lane = next((part[5:] for part in text.split("|") if part.startswith("lane:")), PLAIN_LANE)
    return (int(head) if head.isdigit() else None), lane
