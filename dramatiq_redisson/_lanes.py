"""Which lane a message goes to (flow control; see docs/flow-control-design.md): its
``broker_priority`` and ``group_key``, from the message's options or its actor's.

A message with neither (or a priority of 0, or any priority while the broker's
``max_priority`` is 0) goes to the plain lane, the queue's ready list, exactly as before.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ._keys import PLAIN_LANE, lane_id
from ._settings import is_int

#: The message and actor options flow control reads.
FLOW_OPTIONS = frozenset({"broker_priority", "group_key"})

#: Longest group name (characters): a lane's key holds it (as hex).
MAX_GROUP_LENGTH = 256


def check_group(group: Any, what: str = "group_key") -> str:
    """``group`` if it can name a group (a lane's key holds it as hex), else ValueError
    (``what``: how the message calls it)."""
    if not isinstance(group, str) or not group or len(group) > MAX_GROUP_LENGTH:
        raise ValueError(f"{what} must be a non-empty string of at most {MAX_GROUP_LENGTH} characters, got {group!r}")
    return group


def message_lane(options: Mapping[str, Any], defaults: Mapping[str, Any], max_priority: int) -> str:
    """The lane of a message with ``options``, its actor's options being ``defaults``.

    Raises:
      ValueError: a ``broker_priority`` that is not a non-negative int, or a ``group_key``
        that is not a non-empty string of at most :data:`MAX_GROUP_LENGTH` characters
        (nothing is written: this runs before the send).
    """
    priority = options.get("broker_priority", defaults.get("broker_priority"))
    group = options.get("group_key", defaults.get("group_key"))
    if priority is None:
        priority = 0
    elif not is_int(priority) or priority < 0:
        raise ValueError(f"broker_priority must be a non-negative int, got {priority!r}")
    if group is not None:
        check_group(group)
    priority = min(priority, max_priority)  # above max_priority counts as it (RabbitMQ's rule)
    if not priority and group is None:
        return PLAIN_LANE
    return lane_id(priority, group)
