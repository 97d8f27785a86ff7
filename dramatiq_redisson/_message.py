"""Messages as the broker stores them: the delay and dedupe options a send is checked
against, the redis message id a message is prepared with, and its encoding (compact for
the delayed queue's payload hash). A leaf: it imports nothing else of the package but
the id generator, so every other module may import it."""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import time
from datetime import timedelta
from typing import Any
from uuid import uuid4

from dramatiq import get_encoder
from dramatiq.broker import MessageProxy
from dramatiq.common import q_name
from dramatiq.encoder import JSONEncoder
from dramatiq.message import Message

from ._ids import SORT_KEY_LENGTH, next_sort_key, sort_key_length, sort_key_ms
from ._settings import is_int

#: Longest delay (ms) accepted: ten years. Anything longer is taken for a unit mistake.
MAX_DELAY = 10 * 366 * 86_400_000

#: The fields of a message, in the order ``Message.asdict`` gives them.
_MESSAGE_FIELDS = tuple(field.name for field in dataclasses.fields(Message))
_KNOWN_MESSAGE_FIELDS = ("queue_name", "actor_name", "args", "kwargs", "options", "message_id", "message_timestamp")


def encode_message(message: Message[Any]) -> bytes:
    """``message.encode()`` without looking up the dataclass fields on every call."""
    return get_encoder().encode({name: getattr(message, name) for name in _MESSAGE_FIELDS})


#: The first byte of a compact scheduled payload: ASCII's record separator, which JSON
#: text never holds raw (control characters are escaped inside strings), so the fields
#: split on it. A payload another encoder wrote that begins with it is stored after two.
RS = b"\x1e"

_json_text = json.JSONEncoder(separators=(",", ":")).encode  # what JSONEncoder writes, as str


@functools.lru_cache(maxsize=1024)
def queue_json(queue_name: str) -> str:
    """The queue's name as a JSON string: transfer.lua writes it into compact payloads."""
    return json.dumps(queue_name)


def _compact(message: Message[Any], sort_key: str) -> bytes | None:
    """The compact payload of a prepared scheduled message (see :func:`encode_scheduled`),
    or ``None`` when it could not be written back faithfully."""
    if type(get_encoder()) is not JSONEncoder or _MESSAGE_FIELDS != _KNOWN_MESSAGE_FIELDS:
        return None
    options = message.options
    member, message_id, actor = options.get("redis_message_id"), message.message_id, message.actor_name
    if (
        not isinstance(message_id, str)
        or member != sort_key + message_id
        or sort_key_length(sort_key) != len(sort_key)
        or not _plain(member)
        or not isinstance(actor, str)
        or not actor
        or not isinstance(message.queue_name, str)
    ):
        return None
    rest = {name: value for name, value in options.items() if name != "redis_message_id"}
    timestamp = message.message_timestamp
    if type(timestamp) is int and 0 <= timestamp < 2**53 and len(sort_key) == SORT_KEY_LENGTH:
        # Relative to the sort key's millisecond: a few digits instead of 13 (within 2**53,
        # where Lua's numbers are exact).
        stamp = f"@{timestamp - sort_key_ms(sort_key)}"
    else:
        stamp = _json_text(timestamp)
    fields = (
        _json_text(actor)[1:-1],
        _json_text(message.args),
        "" if not message.kwargs and type(message.kwargs) is dict else _json_text(message.kwargs),
        "" if not rest else _json_text(rest),
        stamp,
    )
    return ("\x1e" + "\x1e".join(fields)).encode()


def _plain(text: str) -> bool:
    """Whether ``text`` is written as itself inside a JSON string (printable ASCII, no
    quote or backslash)."""
    return text.isascii() and text.isprintable() and '"' not in text and "\\" not in text


def encode_scheduled(message: Message[Any], sort_key: str) -> bytes:
    """Encode a prepared scheduled message for the payload hash, as small as it can be
    written back faithfully.

    With Dramatiq's JSON encoder the payload is compact: the JSON text of the actor's name
    (without quotes), args, kwargs, options (without ``redis_message_id``) and timestamp,
    each after a byte 0x1e; empty kwargs and options as nothing, an int timestamp as ``@``
    and its difference to the sort key's millisecond. Field names, the queue's name and
    both ids are left out: the queue is the payload hash's, the member (sort key + message
    id) names both ids. transfer.lua writes the JSON message back when it moves the entry
    (``include/ready_body.lua``; :func:`ready_body` here), so the ready queue holds what
    Dramatiq's encoder writes for the message, ``redis_message_id`` first among its
    options. For the benchmark's message that is 24 bytes instead of 172.

    Otherwise (another encoder, an id that would need escaping) the message is encoded
    as it is, ``redis_message_id`` left out when a JSON encoder wrote it (transfer.lua
    writes it back, right after ``"options":{``) unless that insertion could go wrong.
    """
    compact = _compact(message, sort_key)
    if compact is not None:
        return compact
    member = message.options.pop("redis_message_id")
    try:
        data = encode_message(message)
    finally:
        message.options["redis_message_id"] = member
    if not (
        b'"redis_message_id":"' not in data
        and data.count(b'"options":{') == 1
        and '"' not in member
        and "\\" not in member
        and member.isprintable()
    ):
        data = encode_message(message)
    if data[:1] == RS:
        return RS + RS + data
    return data


def ready_body(member: bytes, body: bytes, queue_name: str) -> bytes:
    """What transfer.lua makes of a stored payload (``body``: after its sort key) when it
    moves the entry to the ready queue: the encoded message (see
    ``scripts/lua/include/ready_body.lua``, which this mirrors byte for byte)."""
    if body[:1] == RS:
        if body[1:2] == RS:
            return body[2:]
        fields = body[1:].split(RS, 4)
        if len(fields) != 5:
            return body
        actor, args, kwargs, options, timestamp = fields
        key_length = sort_key_length(member)
        rmid = b'{"redis_message_id":"' + member + b'"'
        options = rmid + b"}" if options in (b"", b"{}") else rmid + b"," + options[1:]
        if timestamp[:1] == b"@":
            timestamp = str(sort_key_ms(member[:key_length].decode()) + int(timestamp[1:])).encode()
        return b"".join(
            (
                b'{"queue_name":',
                queue_json(queue_name).encode(),
                b',"actor_name":"',
                actor,
                b'","args":',
                args,
                b',"kwargs":',
                kwargs or b"{}",
                b',"options":',
                options,
                b',"message_id":"',
                member[key_length:],
                b'","message_timestamp":',
                timestamp,
                b"}",
            )
        )
    if b'"redis_message_id":"' not in body:
        open_at = body.find(b'"options":{')
        if open_at >= 0:
            cut = open_at + len(b'"options":{')
            rmid = b'"redis_message_id":"' + member + b'"'
            if body[cut : cut + 1] != b"}":
                rmid += b","
            return body[:cut] + rmid + body[cut:]
    return body


def decode_scheduled(member: bytes, stored: bytes, queue_name: str) -> Message[Any]:
    """The message of a stored payload (sort key + payload) of ``queue_name`` whose member
    is ``member``, as it will reach the ready queue.

    Raises:
      dramatiq.errors.DecodeError (or any error of the encoder): it cannot be decoded.
    """
    message = Message.decode(ready_body(member, stored[sort_key_length(stored) :], queue_name))
    message.options["redis_message_id"] = member.decode()
    return message


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
    if not is_int(ttl) or not 0 <= ttl <= MAX_DELAY:
        raise ValueError(f"dedupe_ttl must be a non-negative int of ms (at most {MAX_DELAY}), got {ttl!r}")
    if not delay_ms:
        raise ValueError(
            f"dedupe_key, dedupe and dedupe_ttl apply to scheduled messages: send with a delay (delay={delay_ms!r})"
        )
    return key, mode, ttl


def kept_message(reply: list[Any], queue_name: str) -> Message[Any]:
    """The message that kept a keyed send out (offer.lua's ``[due or -3, member, stored
    payload]``): the scheduled one (with its ``eta``) or the one that moved in the
    key's throttle window."""
    due, member, stored = int(reply[0]), reply[1], reply[2]
    if due == -3:
        return Message.decode(stored)
    message = decode_scheduled(member, stored, queue_name)
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
