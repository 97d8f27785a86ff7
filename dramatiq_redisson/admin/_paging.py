"""Reading and changing a sorted set of entries a step at a time: the argument checks,
the step loop and the head read that the delayed queue and the dead letters share."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

from .._settings import is_int

#: Entries one bulk step changes (the delayed queue's ``promote_all``/``remove_all``, the
#: dead letters' ``requeue``/``purge``): one script call of O(step * log n), about a
#: millisecond on a server with a million scheduled.
BULK_STEP = 500


def check_batch(batch: object, name: str = "batch") -> int:
    """``batch`` as a positive int, or a ValueError naming it."""
    if not is_int(batch) or batch < 1:
        raise ValueError(f"{name} must be a positive int, got {batch!r}")
    return batch


def in_steps(total: int, step: int, run: Callable[[int], int]) -> int:
    """Call ``run(n)`` (one atomic server step acting on up to ``n`` entries, returning how
    many it acted on) until ``total`` entries are done or a step comes up short. Returns
    how many were done."""
    done = 0
    while done < total:
        size = min(step, total - done)
        changed = run(size)
        done += changed
        if changed < size:
            break
    return done


def check_limit(limit: object) -> int | None:
    """``limit`` (None or a non-negative int), or a ValueError."""
    if limit is not None and (not is_int(limit) or limit < 0):
        raise ValueError(f"limit must be None or a non-negative int, got {limit!r}")
    return limit


def read_head(
    client: Any, zset: str, data_hash: str, limit: object, field: Callable[[bytes], Any] = lambda member: member
) -> list[tuple[bytes, float, bytes | None]]:
    """The first ``limit`` entries of ``zset`` (every one for ``None``) as ``(member,
    score, data)``, ``data`` being the member's value in ``data_hash`` under
    ``field(member)`` (``None`` if it has none). Two reads, not one atomic step.

    Raises:
      ValueError: A ``limit`` that is not None or a non-negative int.
    """
    limit = check_limit(limit)
    if limit == 0:
        return []
    entries = cast(
        "list[tuple[bytes, float]]", client.zrange(zset, 0, -1 if limit is None else limit - 1, withscores=True)
    )
    if not entries:
        return []
    stored = cast("list[bytes | None]", client.hmget(data_hash, [field(member) for member, _ in entries]))
    return [(member, score, data) for (member, score), data in zip(entries, stored, strict=True)]
