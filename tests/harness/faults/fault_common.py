"""What the worker app, the producer and the suite share: the record format and the
stamping script.

This module is imported under two names: as ``fault_common`` by the subprocesses (whose
``sys.path`` holds ``tests/harness/faults`` so that they can import the product under test from
another tree, see ``procs.subprocess_env``) and as ``tests.harness.faults.fault_common`` by the
suite. It therefore imports nothing but ``redis``.

A record is one string in the list ``<prefix>:rec`` on the record server:
``kind|seq|attempt|pid|extra|ms``, where ``ms`` is the record server's clock (epoch ms)
read *inside* the script that appends the record, so every time in the analysis comes
from one clock that no fault touches.
"""

from __future__ import annotations

from dataclasses import dataclass

import redis

#: Appends ``ARGV[1] .. '|' .. <server ms>`` to ``KEYS[1]`` and returns the ms. Reading
#: TIME and writing in one script keeps each record to one round trip.
STAMP_LUA = """
local t = redis.call('TIME')
local ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('RPUSH', KEYS[1], ARGV[1] .. '|' .. string.format('%d', ms))
return ms
"""

# Record kinds.
SENT = "sent"  # producer, before the send: extra = "<delay_ms>,<fail_once 0|1>"
REFUSED = "refused"  # producer, the send raised: extra = exception class
PRODUCER_DONE = "done"  # producer finished: seq = messages attempted
READY = "ready"  # a worker process booted: extra = the dramatiq_redisson it imported
START = "start"  # actor run began: extra = run id
FAIL = "fail"  # actor run is about to raise Retry (first attempt of a fail-once message)
FINISH = "finish"  # actor run succeeded


def records_key(prefix: str) -> str:
    return f"{prefix}:rec"


@dataclass(frozen=True)
class Record:
    kind: str
    seq: int
    attempt: int
    pid: int
    extra: str
    ms: int

    @classmethod
    def parse(cls, raw: bytes | str) -> Record:
        text = raw.decode() if isinstance(raw, bytes) else raw
        kind, seq, attempt, pid, extra, ms = text.split("|", 5)
        return cls(kind, int(seq), int(attempt), int(pid), extra, int(ms))


class Stamper:
    """Appends records to the record server, stamped with its clock."""

    def __init__(self, url: str, prefix: str) -> None:
        self.client = redis.Redis.from_url(url)
        self.key = records_key(prefix)
        self._script = self.client.register_script(STAMP_LUA)

    def __call__(self, kind: str, seq: int = 0, attempt: int = 0, pid: int = 0, extra: str = "") -> int:
        if "|" in extra:
            raise ValueError(f"extra must not contain '|': {extra!r}")
        return int(self._script(keys=[self.key], args=[f"{kind}|{seq}|{attempt}|{pid}|{extra}"]))

    def close(self) -> None:
        self.client.close()
