"""Times and lengths of time as text: epoch ms as ISO 8601, lengths of time for people,
and durations and times as people type them. A leaf, used by the periodic schedules (their
``every``, jitter and window), the CLI and the dashboard (through ``_format``).

``parse_duration`` and ``parse_time`` raise :class:`ValueError` with a message meant for
whoever typed the text (the CLI turns it into a usage error, the dashboard into a flash
message, a schedule's declaration into :class:`InvalidSchedule`)."""

from __future__ import annotations

import datetime
import re

from ._message import MAX_DELAY


def iso(ms: int | None, *, precise: bool = True) -> str | None:
    """Epoch ms as an ISO 8601 UTC string (``…Z``), to the millisecond or the second."""
    if ms is None:
        return None
    moment = datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.timezone.utc)
    return moment.isoformat(timespec="milliseconds" if precise else "seconds").replace("+00:00", "Z")


def span(ms: int) -> str:
    """A length of time for people: ``850ms``, ``45s``, ``3m 20s``, ``1h 5m``, ``2d 3h``."""
    ms = abs(ms)
    if ms < 1000:
        return f"{ms}ms"
    seconds = (ms + 500) // 1000
    parts: list[str] = []
    for name, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        value, seconds = divmod(seconds, size)
        if value or parts:
            parts.append(f"{value}{name}")
        if len(parts) == 2:
            break
    return " ".join(part for part in parts if not part.startswith("0"))


def until(due_ms: int, now_ms: int) -> str:
    """When a due time comes, relative to ``now_ms``: ``in 3m 20s`` or ``overdue 4s``."""
    if due_ms > now_ms:
        return f"in {span(due_ms - now_ms)}"
    if due_ms == now_ms:
        return "due now"
    return f"overdue {span(now_ms - due_ms)}"


def ago(when_ms: int, now_ms: int) -> str:
    """How long ago ``when_ms`` was: ``2m ago``."""
    return f"{span(now_ms - when_ms)} ago" if when_ms <= now_ms else f"in {span(when_ms - now_ms)}"


_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")


_DURATION = re.compile(r"(?:\d+(?:\.\d+)?(?:ms|s|m|h|d|w))+")


_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 604_800_000}


def parse_duration(text: str) -> int:
    """``90s``, ``10m``, ``1h30m``, ``2d``, ``500ms``, ``1.5h`` as ms. A bare number is
    refused: seconds or milliseconds would be a guess."""
    compact = text.strip().lower().replace(" ", "")
    if re.fullmatch(r"\d+(?:\.\d+)?", compact):
        raise ValueError(f"duration {text!r} needs a unit, e.g. {compact}s or {compact}ms")
    if not _DURATION.fullmatch(compact):
        raise ValueError(
            f"invalid duration {text!r}: use a number and a unit (ms, s, m, h, d, w), e.g. 90s, 10m, 1h30m, 2d"
        )
    ms = round(sum(float(number) * _UNIT_MS[unit] for number, unit in _DURATION_PART.findall(compact)))
    if ms > MAX_DELAY:
        raise ValueError(f"duration {text!r} is longer than the longest delay (ten years)")
    return ms


def parse_time(text: str) -> int:
    """An ISO 8601 time with a timezone (``2026-12-01T08:00Z``, ``…+01:00``) as epoch ms.
    A time without a timezone is refused rather than guessed."""
    value = text.strip()
    if value[-1:] in ("Z", "z"):
        value = value[:-1] + "+00:00"
    try:
        moment = datetime.datetime.fromisoformat(value)
    except ValueError:
        raise ValueError(
            f"invalid time {text!r}: use ISO 8601 with a timezone, e.g. 2026-12-01T08:00Z or 2026-12-01T09:00+01:00"
        ) from None
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise ValueError(
            f"time {text!r} has no timezone: add Z for UTC or an offset: 2026-12-01T08:00Z, 2026-12-01T09:00+01:00"
        )
    return max(0, int(moment.timestamp() * 1000))
