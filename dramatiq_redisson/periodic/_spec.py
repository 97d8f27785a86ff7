"""Schedule specs for periodic actors: cron expressions and fixed intervals, free of I/O.

A :class:`ScheduleSpec` says *when* a periodic actor is due; the broker decides what
runs. Every time here is an integer count of epoch milliseconds (a UTC instant, on
the server's clock); nothing in this module reads a clock, so the same inputs always
give the same ticks.

Fixed intervals (``every``)
  The ticks are ``anchor_ms + k * every_ms`` for every integer ``k`` (negative too):
  pure integer arithmetic, so a chain of ticks never drifts. The interval is at
  least 100 ms and is kept in whole milliseconds.

Cron expressions (``cron``)
  Standard 5-field expressions (minute, hour, day-of-month, month, day-of-week),
  evaluated by cronsim (https://github.com/cuu508/cronsim) on wall-clock time in the
  spec's IANA zone (``tz``, default ``"UTC"``). The anchor is ignored: cron ticks
  fall on whole minutes. cronsim also reads 6-field expressions (with a leading
  seconds field) and has no ``@hourly``-style aliases; both are rejected here, so a
  spec is always the 5-field form. The stored expression has its whitespace
  collapsed to single spaces and is upper-cased (cronsim reads it upper-cased, so
  ``mon-fri`` and ``MON-FRI`` are the same spec and give the same JSON).

Daylight-saving time follows Debian cron, which is what cronsim implements:

* A job at a *fixed time* -- neither the minute nor the hour field starts with
  ``*`` (``"30 2 * * *"``, ``"0 9 * * MON-FRI"``) -- runs once per matching local
  day. A local time skipped by a spring-forward gap runs once, at the first valid
  instant after the gap (Europe/Berlin, 2026-03-29: ``"30 2 * * *"`` runs at 03:00
  CEST = 01:00 UTC). A local time that happens twice in a fall-back hour runs once,
  at its first occurrence (Europe/Berlin, 2026-10-25: ``"30 2 * * *"`` runs at 02:30
  CEST = 00:30 UTC, not again at 02:30 CET).
* A job with a *wildcard* minute or hour (``"*/5 * * * *"``, ``"0 * * * *"``,
  ``"*/30 2 * * *"``) runs by real elapsed time: ``"*/30 * * * *"`` fires every
  30 real minutes straight through both changes, so it fires in both passes of a
  repeated hour (at distinct instants) and not in a skipped hour. This means
  ``"*/30 2 * * *"`` fires four times on a fall-back day and not at all on a
  spring-forward day, as in Debian cron.

Around cronsim, this module adds one guard: a tick returned is always strictly
after the instant asked about, and ticks are strictly increasing. (For a fixed-time
job cronsim steps through naive local time, so asked from inside the second pass of
a repeated hour it answers with the first pass, an earlier instant; such answers
are skipped.)
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import re
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from .._settings import is_int
from .._times import parse_duration

__all__ = [
    "CATCH_UP_POLICIES",
    "OVERLAP_POLICIES",
    "InvalidSchedule",
    "Policy",
    "ScheduleSpec",
    "catch_up_ticks",
    "jitter_offset",
    "parse_policy",
    "parse_spec",
    "times_text",
]

#: How missed ticks are handled when a schedule's chain resumes: run the latest one,
#: run them all (at most ``limit``), or run none.
CATCH_UP_POLICIES = ("one", "all", "none")

#: What a tick does while the schedule's previous run is still scheduled, queued or
#: running: ``"allow"`` runs anyway (the default), ``"skip"`` skips the tick (counted).
OVERLAP_POLICIES = ("allow", "skip")

#: How many of a cron expression's ticks are looked at for its shortest gap (a jitter must
#: be shorter: see :func:`parse_policy`).
_GAP_PROBE = 500

#: The shortest fixed interval, in milliseconds.
MIN_EVERY_MS = 100

_CRON_FIELDS = "minute hour day-of-month month day-of-week"
_MINUTE_MS = 60_000
_UTC = dt.timezone.utc
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=_UTC)
_ONE_MS = dt.timedelta(milliseconds=1)
# An instant from which a new spec's first tick is looked up, to reject an
# expression that never fires (cronsim gives up after 50 years without a match).
_PROBE = dt.datetime(2000, 1, 1, tzinfo=_UTC)
_JSON_KEYS = frozenset({"cron", "every_ms", "tz"})


class InvalidSchedule(ValueError):
    """A schedule spec (or a catch-up policy) that cannot be used; the message names the field."""


def _zone(tz: str) -> dt.tzinfo:
    if tz == "UTC":
        # No tz database needed for the default, and cronsim takes its UTC fast path.
        return _UTC
    return ZoneInfo(tz)


def _to_ms(moment: dt.datetime) -> int:
    return (moment - _EPOCH) // _ONE_MS


def _format_seconds(ms: int) -> str:
    whole, frac = divmod(ms, 1000)
    if frac == 0:
        return str(whole)
    return f"{whole}.{frac:03d}".rstrip("0")


@dataclass(frozen=True)
class ScheduleSpec:
    """When a periodic actor is due: exactly one of ``cron`` and ``every_ms``.

    Built through :func:`parse_spec` or :meth:`from_json`; the constructor validates
    and normalises too (it raises :class:`InvalidSchedule`), so two specs that mean
    the same schedule compare equal and serialise to the same JSON.
    """

    cron: str | None = None
    every_ms: int | None = None
    tz: str = "UTC"

    def __post_init__(self) -> None:
        if (self.cron is None) == (self.every_ms is None):
            raise InvalidSchedule("schedule: give exactly one of cron and every")
        if not isinstance(self.tz, str) or not self.tz:
            raise InvalidSchedule(f"tz: expected an IANA zone name, got {self.tz!r}")
        if self.every_ms is not None:
            if not is_int(self.every_ms):
                raise InvalidSchedule(f"every: expected whole milliseconds, got {self.every_ms!r}")
            if self.every_ms < MIN_EVERY_MS:
                raise InvalidSchedule(f"every: must be at least {MIN_EVERY_MS} ms (0.1 s), got {self.every_ms} ms")
            if self.tz != "UTC":
                raise InvalidSchedule(f"tz applies to cron schedules only, got tz={self.tz!r} with every")
            return
        assert self.cron is not None
        try:
            zone = _zone(self.tz)
        except (ZoneInfoNotFoundError, ValueError, OSError) as exc:
            raise InvalidSchedule(f"tz: unknown time zone {self.tz!r}") from exc
        object.__setattr__(self, "cron", _check_cron(self.cron, zone))

    # -- presentation -------------------------------------------------------------

    def describe(self) -> str:
        """A short human-readable form: ``"cron */5 * * * * (Europe/Berlin)"``, ``"every 1.5s"``."""
        if self.cron is not None:
            return f"cron {self.cron} ({self.tz})"
        assert self.every_ms is not None
        ms = self.every_ms
        if ms % 3_600_000 == 0:
            return f"every {ms // 3_600_000}h"
        if ms % _MINUTE_MS == 0:
            return f"every {ms // _MINUTE_MS}m"
        return f"every {_format_seconds(ms)}s"

    def to_json(self) -> str:
        """Canonical compact JSON (sorted keys, no spaces): equal specs give equal text."""
        return json.dumps(
            {"cron": self.cron, "every_ms": self.every_ms, "tz": self.tz},
            sort_keys=True,
            separators=(",", ":"),
            ensure_ascii=True,
        )

    @classmethod
    def from_json(cls, text: str | bytes) -> ScheduleSpec:
        """The spec :meth:`to_json` wrote; :class:`InvalidSchedule` on anything else."""
        try:
            data: Any = json.loads(text)
        except (ValueError, TypeError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
            raise InvalidSchedule(f"schedule: not valid JSON: {exc}") from exc
        if not isinstance(data, dict):
            raise InvalidSchedule(f"schedule: expected a JSON object, got {type(data).__name__}")
        unknown = set(data) - _JSON_KEYS
        if unknown:
            raise InvalidSchedule(f"schedule: unknown keys {sorted(unknown)}")
        cron = data.get("cron")
        every_ms = data.get("every_ms")
        tz = data.get("tz", "UTC")
        if cron is not None and not isinstance(cron, str):
            raise InvalidSchedule(f"cron: expected a string, got {cron!r}")
        if every_ms is not None and (not is_int(every_ms)):
            raise InvalidSchedule(f"every: expected whole milliseconds, got {every_ms!r}")
        if not isinstance(tz, str):
            raise InvalidSchedule(f"tz: expected a string, got {tz!r}")
        return cls(cron=cron, every_ms=every_ms, tz=tz)

    # -- ticks ----------------------------------------------------------------------

    def next_after(self, after_ms: int, anchor_ms: int) -> int:
        """The first tick strictly after ``after_ms`` (``anchor_ms`` places fixed-interval ticks)."""
        if self.every_ms is not None:
            return anchor_ms + ((after_ms - anchor_ms) // self.every_ms + 1) * self.every_ms
        return next(self._cron_ticks(after_ms))

    def ticks_between(self, after_ms: int, until_ms: int, anchor_ms: int, limit: int) -> list[int]:
        """The ticks ``t`` with ``after_ms < t <= until_ms``, ascending.

        When there are more than ``limit`` of them, the *last* ``limit`` are returned
        (the most recent ones are those a catch-up wants), still in ascending order.
        """
        if limit < 1:
            raise ValueError(f"limit must be at least 1, got {limit}")
        if until_ms <= after_ms:
            return []
        if self.every_ms is not None:
            step = self.every_ms
            first = (after_ms - anchor_ms) // step + 1
            last = (until_ms - anchor_ms) // step
            first = max(first, last - limit + 1)
            return [anchor_ms + k * step for k in range(first, last + 1)]
        # Look back from until_ms over a window that doubles until it holds `limit`
        # ticks or reaches after_ms, so a long gap costs about `limit` cron steps
        # rather than one per tick since after_ms. The window's start only moves
        # where cronsim starts; ticks are the same whatever the start (see the guard
        # in _cron_ticks).
        width = limit * _MINUTE_MS
        while True:
            start = max(after_ms, until_ms - width)
            found: deque[int] = deque(maxlen=limit)
            for tick in self._cron_ticks(start):
                if tick > until_ms:
                    break
                found.append(tick)
            if len(found) >= limit or start == after_ms:
                return list(found)
            width *= 2

    def shortest_gap(self) -> int:
        """The shortest time (ms) between two ticks (for cron, among its next
        :data:`_GAP_PROBE` ticks after a fixed instant)."""
        if self.every_ms is not None:
            return self.every_ms
        ticks = self._cron_ticks(_to_ms(_PROBE))
        previous, gap = next(ticks), None
        for _ in range(_GAP_PROBE):
            tick = next(ticks)
            gap = tick - previous if gap is None else min(gap, tick - previous)
            previous = tick
        assert gap is not None
        return gap

    def _cron_ticks(self, after_ms: int) -> _CronTicks:
        assert self.cron is not None
        return _CronTicks(self.cron, _zone(self.tz), after_ms)


class _CronTicks:
    """cronsim's ticks after an instant, as epoch ms, each strictly after the one before."""

    def __init__(self, cron: str, zone: dt.tzinfo, after_ms: int) -> None:
        self._cron = cron
        self._last = after_ms
        # cronsim drops sub-second parts and starts one second later: still strictly after.
        start = dt.datetime.fromtimestamp(after_ms // 1000, tz=zone)
        self._sim = CronSim(cron, start)

    def __iter__(self) -> _CronTicks:
        return self

    def __next__(self) -> int:
        while True:
            try:
                moment = next(self._sim)
            except StopIteration:
                raise InvalidSchedule(f"cron: {self._cron!r} has no tick within 50 years") from None
            tick = _to_ms(moment)
            if tick > self._last:
                self._last = tick
                return tick


_SPACE = re.compile(r"\s+")


def _check_cron(expr: str, zone: dt.tzinfo) -> str:
    if not isinstance(expr, str):
        raise InvalidSchedule(f"cron: expected a string, got {expr!r}")
    normal = _SPACE.sub(" ", expr.strip()).upper()
    if normal.startswith("@"):
        raise InvalidSchedule(
            f"cron: {expr!r}: @-aliases are not supported, write the 5 fields ({_CRON_FIELDS}), e.g. '0 0 * * *'"
        )
    fields = normal.split(" ") if normal else []
    if len(fields) != 5:
        raise InvalidSchedule(f"cron: {expr!r} has {len(fields)} fields, expected 5 ({_CRON_FIELDS})")
    try:
        sim = CronSim(normal, _PROBE.astimezone(zone))
    except CronSimError as exc:
        raise InvalidSchedule(f"cron: {expr!r} is not a valid cron expression: {exc}") from exc
    try:
        next(sim)
    except StopIteration:
        raise InvalidSchedule(f"cron: {expr!r} never fires") from None
    return normal


def parse_spec(
    *,
    cron: str | None = None,
    every: str | dt.timedelta | None = None,
    tz: str | None = None,
) -> ScheduleSpec:
    """A spec from user input: exactly one of ``cron`` (with an optional ``tz``) and ``every``.

    ``every`` is a :class:`datetime.timedelta` or a duration with its unit, as the command
    line takes them (``"30s"``, ``"5m"``, ``"1h30m"``, ``"250ms"``: see
    :func:`._times.parse_duration`); it is kept in whole milliseconds and must be at least
    0.1 s. A bare number is refused: every other time of the package is in milliseconds,
    and ``every`` was once in seconds, so a unit is never guessed. Raises
    :class:`InvalidSchedule`.
    """
    if (cron is None) == (every is None):
        raise InvalidSchedule("schedule: give exactly one of cron and every")
    if every is not None:
        if tz is not None:
            raise InvalidSchedule(f"tz applies to cron schedules only, got tz={tz!r} with every")
        every_ms, shown = _duration_ms("every", every)
        if every_ms <= 0:
            raise InvalidSchedule(f"every: must be greater than 0, got {shown}")
        if every_ms < MIN_EVERY_MS:
            raise InvalidSchedule(f"every: must be at least 0.1s ({MIN_EVERY_MS} ms), got {shown}")
        return ScheduleSpec(cron=None, every_ms=every_ms, tz="UTC")
    return ScheduleSpec(cron=cron, every_ms=None, tz="UTC" if tz is None else tz)


def _duration_ms(field: str, value: object) -> tuple[int, str]:
    """A duration argument (``field``) in whole milliseconds, and how to show it in an
    error: a :class:`datetime.timedelta` (floored to the millisecond) or a text with its
    unit (:func:`._times.parse_duration`); a bare number is refused, its unit would be a
    guess."""
    if isinstance(value, dt.timedelta):
        return value // _ONE_MS, f"{value.total_seconds()}s"
    if isinstance(value, str):
        try:
            return parse_duration(value), repr(value)
        except ValueError as e:
            raise InvalidSchedule(f"{field}: {e}") from None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        raise InvalidSchedule(
            f'{field}={value!r} has no unit: write {field}=timedelta(seconds={value!r}) or {field}="{value!r}s"'
        )
    raise InvalidSchedule(
        f'{field}: expected a timedelta or a duration with its unit ("30s", "5m", "250ms"), got {value!r}'
    )


@dataclass(frozen=True)
class Policy:
    """How a schedule behaves under load (see :func:`parse_policy`); every field's default
    is today's behaviour. Times are epoch ms, durations ms."""

    overlap: str = "allow"
    jitter_ms: int | None = None
    start_deadline_ms: int | None = None
    start_ms: int | None = None
    end_ms: int | None = None
    limit: int | None = None

    def stored(self) -> dict[str, Any]:
        """The fields that differ from the defaults, as stored in a schedule's definition
        (a schedule without them keeps the definition an earlier version stored)."""
        return {k: v for k, v in self.__dict__.items() if v != Policy.__dataclass_fields__[k].default}

    @classmethod
    def from_stored(cls, stored: dict[str, Any]) -> Policy:
        """The policy a stored definition names (fields it does not name: the defaults).
        Raises :class:`InvalidSchedule` for a value of the wrong kind (a hand edit)."""
        fields = {k: stored[k] for k in cls.__dataclass_fields__ if stored.get(k) is not None}
        for key, value in fields.items():
            if key == "overlap" and value not in OVERLAP_POLICIES or key != "overlap" and not is_int(value):
                raise InvalidSchedule(f"{key}: unreadable stored value {value!r}")
        return cls(**fields)

    def in_window(self, tick_ms: int) -> bool:
        """Whether a tick at ``tick_ms`` falls in the window (``start <= tick <= end``)."""
        return (self.start_ms is None or tick_ms >= self.start_ms) and (self.end_ms is None or tick_ms <= self.end_ms)

    def offset(self, name: str, tick_ms: int) -> int:
        """The jitter of schedule ``name``'s tick at ``tick_ms`` (0 without jitter)."""
        return jitter_offset(name, tick_ms, self.jitter_ms or 0)

    def tick_options(self) -> dict[str, Any]:
        """The options a tick carries for the worker that starts it: its start deadline and
        jitter (to work out when it was due), when the schedule has a deadline."""
        if self.start_deadline_ms is None:
            return {}
        found: dict[str, Any] = {"periodic_start_deadline_ms": self.start_deadline_ms}
        if self.jitter_ms:
            found["periodic_jitter_ms"] = self.jitter_ms
        return found


def times_text(name: str, policy: Policy, ticks: Iterable[int]) -> str:
    """Tick times as the schedule state stores them (``<name>|t``, see lua/schedule.lua):
    ``"<tick>"``, or ``"<tick>+<jitter ms>"`` for a tick due later than its time."""
    parts = []
    for tick in ticks:
        offset = policy.offset(name, tick)
        parts.append(f"{tick}+{offset}" if offset else str(tick))
    return ",".join(parts)


def jitter_offset(name: str, tick_ms: int, jitter_ms: int) -> int:
    """A tick's delay in ``[0, jitter_ms)``, the same on every worker and every run: a
    hash of the schedule's name and the tick's nominal time, not a random draw (two
    workers that compute the next ticks of one schedule store the same due times)."""
    if jitter_ms <= 1:
        return 0
    digest = hashlib.blake2b(f"{name}\0{tick_ms}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % jitter_ms


def _aware_ms(field: str, value: object) -> int:
    if not isinstance(value, dt.datetime):
        raise InvalidSchedule(f"{field}: expected an aware datetime, got {value!r}")
    if value.tzinfo is None or value.utcoffset() is None:
        raise InvalidSchedule(
            f"{field}: {value.isoformat()} has no time zone: give an aware datetime, e.g. "
            f"datetime({value.year}, {value.month}, {value.day}, tzinfo=timezone.utc)"
        )
    return _to_ms(value)


def parse_policy(
    spec: ScheduleSpec | None,
    *,
    overlap: object = "allow",
    jitter: object = None,
    start_deadline: object = None,
    start: object = None,
    end: object = None,
    limit: object = None,
) -> tuple[Policy | None, list[str]]:
    """A :class:`Policy` from user input, and what is wrong with it: every bad value, each
    as one line naming its argument (the policy is None when there is any). ``spec``: the
    schedule's spec, to check that a jitter is shorter than the gap between two ticks
    (None: the spec itself is bad, not checked)."""
    errors: list[str] = []
    found: dict[str, Any] = {}
    if overlap not in OVERLAP_POLICIES:
        errors.append(f"overlap: expected one of {', '.join(repr(p) for p in OVERLAP_POLICIES)}, got {overlap!r}")
    else:
        found["overlap"] = overlap
    for field, value in (("jitter", jitter), ("start_deadline", start_deadline)):
        if value is None:
            continue
        try:
            ms, shown = _duration_ms(field, value)
        except InvalidSchedule as e:
            errors.append(str(e))
            continue
        if ms <= 0:
            errors.append(f"{field}: must be at least 1 ms, got {shown}")
            continue
        found[f"{field}_ms"] = ms
    if "jitter_ms" in found and spec is not None:
        gap = spec.shortest_gap()
        if found["jitter_ms"] >= gap:
            errors.append(
                f"jitter: must be shorter than the shortest time between two ticks ({gap} ms for "
                f"{spec.describe()}), got {found['jitter_ms']} ms"
            )
    for field, value in (("start", start), ("end", end)):
        if value is not None:
            try:
                found[f"{field}_ms"] = _aware_ms(field, value)
            except InvalidSchedule as e:
                errors.append(str(e))
    if "start_ms" in found and "end_ms" in found and found["end_ms"] <= found["start_ms"]:
        errors.append(f"end: must be after start ({end!r} is not after {start!r})")
    if limit is not None:
        if not is_int(limit) or limit < 1:
            errors.append(f"limit: expected a whole number of runs, at least 1, got {limit!r}")
        else:
            found["limit"] = limit
    return (None if errors else Policy(**found)), errors


def catch_up_ticks(
    spec: ScheduleSpec,
    last_due_ms: int,
    now_ms: int,
    anchor_ms: int,
    policy: str,
    limit: int = 1000,
) -> tuple[list[int], int]:
    """What to run when a schedule's chain resumes, and when its next tick is.

    ``last_due_ms`` is the tick that was due and has not run; the missed ticks are
    the spec's ticks ``t`` with ``last_due_ms <= t <= now_ms``. Returns
    ``(ticks_to_run_now, next_tick_ms)``:

    * ``"one"``: the latest missed tick (if any); ``"all"``: every missed tick,
      ascending (the last ``limit`` of them); ``"none"``: nothing.
    * ``next_tick_ms`` is the first tick strictly after ``now_ms``.

    When nothing is due yet (``now_ms < last_due_ms``) the answer is ``([], t)``
    whatever the policy, ``t`` the first tick at or after ``last_due_ms``: the pending
    tick stays as it is. (A chain that ran out of times stops at its last tick + 1, not
    a tick: resumed within that millisecond, it must not get a tick there.)
    Raises :class:`InvalidSchedule` for a policy not in :data:`CATCH_UP_POLICIES`.
    """
    if policy not in CATCH_UP_POLICIES:
        raise InvalidSchedule(f"catch_up: unknown policy {policy!r}, expected one of {', '.join(CATCH_UP_POLICIES)}")
    if now_ms < last_due_ms:
        return [], spec.next_after(last_due_ms - 1, anchor_ms)
    next_tick = spec.next_after(now_ms, anchor_ms)
    if policy == "none":
        return [], next_tick
    # Ticks are whole milliseconds, so "t >= last_due_ms" is "t > last_due_ms - 1".
    missed = spec.ticks_between(last_due_ms - 1, now_ms, anchor_ms, 1 if policy == "one" else limit)
    return missed, next_tick
