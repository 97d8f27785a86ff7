"""Which lane a message goes to (flow control; see docs/flow-control-design.md): its
``broker_priority`` and ``group_key``, from the message's options or its actor's.

A message with neither (or a priority of 0, or any priority while the broker's
``max_priority`` is 0) goes to the plain lane, the queue's ready list, exactly as before.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

from .._keys import PLAIN_LANE, lane_id
from .._settings import is_int

#: The message and actor options flow control reads.
FLOW_OPTIONS = frozenset({"broker_priority", "group_key"})

#: Longest group name (characters): a lane's key holds it (as hex).
MAX_GROUP_LENGTH = 256


def _group_problem(group: Any, what: str = "group_key") -> str | None:
    """Why ``group`` cannot name a group (a lane's key holds it as hex), or None."""
    if isinstance(group, str) and group and len(group) <= MAX_GROUP_LENGTH:
        return None
    return f"{what} must be a non-empty string of at most {MAX_GROUP_LENGTH} characters, got {group!r}"


def _priority_problem(priority: Any) -> str | None:
    """Why ``priority`` cannot be a ``broker_priority``, or None (None itself: no priority)."""
    if priority is None or (is_int(priority) and priority >= 0):
        return None
    return f"broker_priority must be a non-negative int, got {priority!r}"


def check_group(group: Any, what: str = "group_key") -> str:
    """``group`` if it can name a group (a lane's key holds it as hex), else ValueError
    (``what``: how the message calls it)."""
    problem = _group_problem(group, what)
    if problem:
        raise ValueError(problem)
    return cast(str, group)


def flow_option_problems(options: Mapping[str, Any]) -> list[str]:
    """What is wrong with the flow options among ``options`` (an actor's as declared, or a
    message's merged with its actor's): one text per bad option, naming it and its value;
    an empty list when they are good. The one check of these options: a send runs it
    through :func:`message_lane`, ``RedissonBroker.declare_actor`` on an actor's options."""
    group = options.get("group_key")
    problems = (
        _priority_problem(options.get("broker_priority")),
        None if group is None else _group_problem(group),
    )
    return [problem for problem in problems if problem]


def message_lane(options: Mapping[str, Any], defaults: Mapping[str, Any], max_priority: int) -> str:
    """The lane of a message with ``options``, its actor's options being ``defaults``.

    Raises:
      ValueError: a ``broker_priority`` that is not a non-negative int, or a ``group_key``
        that is not a non-empty string of at most :data:`MAX_GROUP_LENGTH` characters
        (nothing is written: this runs before the send); see :func:`flow_option_problems`.
    """
    priority = options.get("broker_priority", defaults.get("broker_priority"))
    group = options.get("group_key", defaults.get("group_key"))
    if _priority_problem(priority) or (group is not None and _group_problem(group)):
        raise ValueError("; ".join(flow_option_problems({"broker_priority": priority, "group_key": group})))
    if priority is None:
        priority = 0
    priority = min(priority, max_priority)  # above max_priority counts as it (RabbitMQ's rule)
    if not priority and group is None:
        return PLAIN_LANE
    return lane_id(priority, group)
