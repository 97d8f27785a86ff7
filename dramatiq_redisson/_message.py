"""Messages as the broker stores them: the delay and dedupe options a send is checked
against, the redis message id a message is prepared with, and its encoding (compact for
the delayed queue's payload hash). A leaf: it imports nothing else of the package but
the id generator, so every other module may import it."""

from __future__ import annotations

import dataclasses
import math
import time
from datetime import timedelta
from typing import Any
from uuid import uuid4

from dramatiq import get_encoder
from dramatiq.broker import MessageProxy
from dramatiq.common import q_name
from dramatiq.message import Message

from ._ids import next_sort_key

#: Longest delay (ms) accepted: ten years. Anything longer is taken for a unit mistake.
MAX_DELAY = 10 * 366 * 86_400_000

#: The fields of a message, in the order ``Message.asdict`` gives them.
_MESSAGE_FIELDS = tuple(field.name for field in dataclasses.fields(Message))
_KNOWN_MESSAGE_FIELDS = ("queue_name", "actor_name", "args", "kwargs", "options", "message_id", "message_timestamp")


def encode_message(message: Message[Any]) -> bytes:
    """``message.encode()`` without looking up the dataclass fields on every call."""
    return get_encoder().encode({name: getattr(message, name) for name in _MESSAGE_FIELDS})


def encode_scheduled(message: Message[Any], sort_key: str) -> bytes:
    """Encode a prepared scheduled message for the payload hash, compactly when possible.

    The member (sort key + message id) is the message's ``redis_message_id``. With a JSON
    encoder the stored copy leaves that option out, about 37 bytes less per scheduled
    message; transfer.lua writes it back, right after ``"options":{``, when it moves the
    message, so what reaches the ready queue names the member as any ready message does.
    The full encoding is stored instead when that insertion could go wrong: another
    encoder, ``"options":{`` or ``"redis_message_id":"`` showing up in an argument, or a
    member that would need escaping inside a JSON string.
    """
    member = message.options.pop("redis_message_id")
    try:
        data = encode_message(message)
    finally:
        message.options["redis_message_id"] = member
    if (
        b'"redis_message_id":"' not in data
        and data.count(b'"options":{') == 1
        and '"' not in member
        and "\\" not in member
        and member.isprintable()
    ):
        return data
    return encode_message(message)


def epoch_ms(time_reply: tuple[Any, Any]) -> int:
    """A ``TIME`` reply as epoch ms."""
    seconds, micros = time_reply
    return int(seconds) * 1000 + int(micros) // 1000


def eta_estimate(delay_ms: int | None) -> int | None:
    """For a delayed send, the ``eta`` the built-in broker would give it (now + delay on
    this process's clock, epoch ms), handed to ``before_enqueue``; else ``None``."""
    if not delay_ms:
        return None
    return int(time.time() * 1000) + delay_ms


def validate_delay(delay: Any) -> int | None:
    """Return ``delay`` as whole milliseconds, or ``None`` for no delay.

    A fractional delay is rounded up (never earlier than asked); a negative one means
    "already due" and becomes 0 (run now), as with the built-in broker, Sidekiq, BullMQ
    and Celery, where producers compute ``delay = due - now``.

    Raises:
      TypeError: If ``delay`` is not a number of milliseconds or a timedelta (a bool is not).
      ValueError: If ``delay`` is NaN, infinite or longer than :data:`MAX_DELAY`.
    """
    if delay is None:
        return None
    if isinstance(delay, timedelta):
        delay = delay.total_seconds() * 1000
    if isinstance(delay, bool) or not isinstance(delay, (int, float)):
        raise TypeError(f"delay must be a number of milliseconds or a timedelta, not {type(delay).__name__}")
    if isinstance(delay, float):
        if not math.isfinite(delay):
            raise ValueError(f"delay must be finite, got {delay!r}")
        delay = math.ceil(delay)
    if delay > MAX_DELAY:
        raise ValueError(f"delay must be at most {MAX_DELAY} ms (ten years), got {delay!r}")
    return max(0, int(delay))


#: The ``dedupe`` option's values: what a send does while another message holds its
#: ``dedupe_key`` (see :meth:`RedissonBroker.enqueue`).
DEDUPE_MODES = ("keep", "replace")

#: The message options of a keyed send.
DEDUPE_OPTIONS = ("dedupe_key", "dedupe", "dedupe_ttl")


def dedupe_options(options: dict[str, Any], delay_ms: int | None) -> tuple[str, str, int] | None:
    """A send's dedupe key, mode and throttle ttl (ms, 0 for none) from its message
    options (``dedupe_key``, ``dedupe``, ``dedupe_ttl``), or ``None`` when it has none.

    Raises:
      ValueError: A ``dedupe``/``dedupe_ttl`` without a ``dedupe_key``, a key that is not
        a non-empty str, an unknown mode, a ttl that is not a non-negative int of ms up to
        :data:`MAX_DELAY` (the options travel in the encoded message), or any of them on a send without a delay.
    """
    if not any(options.get(name) is not None for name in DEDUPE_OPTIONS):
        return None
    key, mode, ttl = (options.get(name) for name in DEDUPE_OPTIONS)
    if key is None:
        raise ValueError("dedupe= and dedupe_ttl= need a dedupe_key=")
    if not isinstance(key, str) or not key:
        raise ValueError(f"dedupe_key must be a non-empty str, got {key!r}")
    if mode is None:
        mode = "keep"
    if mode not in DEDUPE_MODES:
        raise ValueError(f"dedupe must be one of {', '.join(map(repr, DEDUPE_MODES))}, got {mode!r}")
    if ttl is None:
        ttl = 0
    if isinstance(ttl, bool) or not isinstance(ttl, int) or not 0 <= ttl <= MAX_DELAY:
        raise ValueError(f"dedupe_ttl must be a non-negative int of ms (at most {MAX_DELAY}), got {ttl!r}")
    if not delay_ms:
        raise ValueError(
            f"dedupe_key, dedupe and dedupe_ttl apply to scheduled messages: send with a delay (delay={delay_ms!r})"
        )
    return key, mode, ttl


def kept_message(reply: list[Any]) -> Message[Any]:
    """The message that kept a keyed send out (offer.lua's ``[due or -3, member, stored
    payload]``): the scheduled one (with its ``eta``) or the one that moved in the
    key's throttle window."""
    due, member, stored = int(reply[0]), reply[1], reply[2]
    if due == -3:
        return Message.decode(stored)
    message = Message.decode(stored[16:])
    message.options["redis_message_id"] = member.decode()
    if due >= 0:
        message.options["eta"] = due
    return message


def ready_id(message: Message[Any]) -> str:
    """The redis message id of an immediate send: the message id, so that sending
    the same message again is recognised (see enqueue.lua); a fresh one for a
    message being processed (a retry), whose current copy is still in flight."""
    if isinstance(message, MessageProxy):
        return str(uuid4())
    return message.message_id


def with_redis_id(message: Message[Any], redis_message_id: str) -> Message[Any]:
    """A copy of ``message`` with ``redis_message_id``, its canonical queue and no ``eta``."""
    options = {**message.options, "redis_message_id": redis_message_id}
    options.pop("eta", None)
    if _MESSAGE_FIELDS != _KNOWN_MESSAGE_FIELDS:  # a newer Message: let dataclasses copy every field
        return dataclasses.replace(message, queue_name=q_name(message.queue_name), options=options)
    # A third cheaper than dataclasses.replace, which matters for enqueue_many.
    return Message(
        queue_name=q_name(message.queue_name),
        actor_name=message.actor_name,
        args=message.args,
        kwargs=message.kwargs,
        options=options,
        message_id=message.message_id,
        message_timestamp=message.message_timestamp,
    )


def prepare_scheduled(message: Message[Any], sort_key: str | None = None) -> tuple[Message[Any], str]:
    """A copy of ``message`` ready to be offered to its delayed queue (``sort_key``, or
    a new one, ``redis_message_id`` = sort key + message id, canonical queue, no
    ``eta``), and its sort key. Used for new offers, bulk offers (with keys reserved
    by ``next_sort_keys``) and messages migrated from ``.DQ``."""
    if sort_key is None:
        sort_key = next_sort_key()
    return with_redis_id(message, sort_key + message.message_id), sort_key


def prepare(message: Message[Any], delay_ms: int | None) -> tuple[Message[Any], str]:
    """Give ``message`` its redis id and canonical queue; drop any ``eta``. Returns the
    message and its sort key ("" if it is not delayed)."""
    if delay_ms:
        return prepare_scheduled(message)
    return with_redis_id(message, ready_id(message)), ""
