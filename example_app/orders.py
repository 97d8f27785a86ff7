"""Order state kept in Redis: one hash per order and an event log per demo run.

Every state change is a compare-and-set done by a Lua script, so a payment and a
timer that fire at the same moment cannot both win: whichever comes second sees
the order already settled and leaves it alone. Each script stamps its event with
the *server's* clock, the clock the delayed queue computes due times with, so
lateness against a due time is measured on one clock.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Final, Literal

import redis

#: Key prefix of everything the example app stores.
PREFIX = "example_app"

#: Seconds the keys of a run live, in case a run dies before cleaning up.
KEY_TTL = 3600

PENDING: Final = "pending"
PAID: Final = "paid"
CANCELLED: Final = "cancelled"

Status = Literal["pending", "paid", "cancelled"]

# KEYS[1] events list; ARGV[1] JSON object of the event, without its time.
# Returns the server time (epoch ms) the event was stamped with.
_LOG = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local event = cjson.decode(ARGV[1])
event['t'] = now
redis.call('RPUSH', KEYS[1], cjson.encode(event))
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[2]))
return now
"""

# KEYS[1] order hash, KEYS[2] events list; ARGV[1] expected status, ARGV[2] new
# status, ARGV[3] JSON event, ARGV[4] TTL. Moves the order from the expected status
# to the new one if it is still there, and logs the event with "ok" (whether it
# moved) and "seen" (the status found). Returns {ok, server time in ms}.
_TRANSITION = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local seen = redis.call('HGET', KEYS[1], 'status')
local ok = 0
if seen == ARGV[1] then
  redis.call('HSET', KEYS[1], 'status', ARGV[2], 'settled_ms', now)
  ok = 1
end
local event = cjson.decode(ARGV[3])
event['t'] = now
event['ok'] = ok == 1
event['seen'] = seen or 'missing'
redis.call('RPUSH', KEYS[2], cjson.encode(event))
redis.call('EXPIRE', KEYS[2], tonumber(ARGV[4]))
return {ok, now}
"""


@dataclass(frozen=True)
class Event:
    """One entry of a run's event log.

    Attributes:
      t: Server time of the event, epoch ms.
      kind: ``placed``, ``paid``, ``timer_removed`` or ``timer_fired``.
      order: The order number.
      ok: For transitions: whether the order changed state. For ``timer_removed``:
        whether the timer was still scheduled and got cancelled.
      seen: For transitions: the order's status before the event.
      data: Any other fields of the event.
    """

    t: int
    kind: str
    order: int
    ok: bool = True
    seen: str = ""
    data: dict[str, Any] | None = None

    @classmethod
    def decode(cls, raw: bytes | str) -> Event:
        fields = json.loads(raw)
        known = {name: fields.pop(name) for name in ("t", "kind", "order", "ok", "seen") if name in fields}
        return cls(**known, data=fields or None)


class OrderStore:
    """The orders and the event log of one demo run.

    Parameters:
      client: A client of the Redis server the broker uses.
      run_id: Tells this run's keys apart from other runs on the same server.
    """

    def __init__(self, client: redis.Redis, run_id: str) -> None:
        self.client = client
        self.run_id = run_id
        self.events_key = f"{PREFIX}:{run_id}:events"
        self._log = client.register_script(_LOG)
        self._transition = client.register_script(_TRANSITION)

    def order_key(self, order: int) -> str:
        return f"{PREFIX}:{self.run_id}:order:{order}"

    def now_ms(self) -> int:
        """The server's clock, epoch ms."""
        seconds, micros = self.client.time()
        return int(seconds) * 1000 + int(micros) // 1000

    def log(self, kind: str, order: int, **fields: Any) -> int:
        """Append an event stamped with the server's clock; returns that time (epoch ms)."""
        event = json.dumps({"kind": kind, "order": order, **fields})
        return int(self._log(keys=[self.events_key], args=[event, KEY_TTL]))

    def create(self, order: int) -> None:
        """Store a new, unpaid order."""
        key = self.order_key(order)
        with self.client.pipeline(transaction=True) as pipe:
            pipe.hset(key, "status", PENDING)
            pipe.expire(key, KEY_TTL)
            pipe.execute()

    def set_timer(self, order: int, message_id: str) -> None:
        """Remember the id of the order's cancel-if-unpaid message."""
        self.client.hset(self.order_key(order), "timer_id", message_id)

    def timer_id(self, order: int) -> str | None:
        value = self.client.hget(self.order_key(order), "timer_id")
        return value.decode() if isinstance(value, bytes) else value

    def status(self, order: int) -> str | None:
        value = self.client.hget(self.order_key(order), "status")
        return value.decode() if isinstance(value, bytes) else value

    def pay(self, order: int) -> bool:
        """Mark a pending order paid. False if it was not pending (the timer won)."""
        return self._move(order, PENDING, PAID, "paid")

    def cancel_if_unpaid(self, order: int) -> bool:
        """Cancel an order that is still pending. False if it was not (it got paid)."""
        return self._move(order, PENDING, CANCELLED, "timer_fired")

    def _move(self, order: int, expected: Status, new: Status, kind: str) -> bool:
        event = json.dumps({"kind": kind, "order": order})
        ok, _ = self._transition(keys=[self.order_key(order), self.events_key], args=[expected, new, event, KEY_TTL])
        return bool(ok)

    def pop_events(self, timeout: float = 0) -> list[Event]:
        """Take the logged events, oldest first; wait up to ``timeout`` seconds for the first."""
        events: list[Event] = []
        if timeout > 0:
            first = self.client.blpop([self.events_key], timeout=timeout)
            if first is None:
                return events
            events.append(Event.decode(first[1]))
        with self.client.pipeline(transaction=True) as pipe:
            pipe.lrange(self.events_key, 0, -1)
            pipe.delete(self.events_key)
            rest, _ = pipe.execute()
        events.extend(Event.decode(raw) for raw in rest)
        return events

    def delete(self, orders: list[int]) -> None:
        """Drop the run's keys."""
        self.client.delete(self.events_key, *(self.order_key(order) for order in orders))
