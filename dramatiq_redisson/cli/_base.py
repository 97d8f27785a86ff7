"""What every command shares: exit statuses, defaults, the usage error, argument types,
the context a handler gets, and :class:`Command`, how a command declares itself."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .._format import parse_duration, parse_time

if TYPE_CHECKING:
    from .. import RedissonBroker
    from ._output import Output

PROG = "dramatiq-redisson"


EXIT_OK = 0


#: A message id was not found, or the operator declined a confirmation.
EXIT_NOT_FOUND = 1


#: A usage error (bad arguments, unknown broker path, refused confirmation) or a
#: connection error.
EXIT_USAGE = 2


#: Messages ``list`` and ``dead list`` show unless told otherwise (``--limit 0``: all).
DEFAULT_LIMIT = 50


#: Set to a non-empty value (other than ``0``) to print plain text tables even when
#: ``rich`` is installed.
PLAIN_ENV = "DRAMATIQ_REDISSON_PLAIN"


#: Set to a non-empty value (other than ``0``) to see the traceback of an unexpected error.
DEBUG_ENV = "DRAMATIQ_REDISSON_DEBUG"


#: Seconds to wait for a TCP connection to the server (``--url`` form).
CONNECT_TIMEOUT = 5.0


#: Seconds to wait for one reply of the server (``--url`` form).
SOCKET_TIMEOUT = 30.0


class UsageError(Exception):
    """A problem the operator can fix: reported as one line on stderr, exit status 2."""


def _whole_number(text: str, least: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < least:
        raise argparse.ArgumentTypeError(f"expected {least} or more, got {value}")
    return value


def non_negative_int(text: str) -> int:
    return _whole_number(text, 0)


def positive_int(text: str) -> int:
    return _whole_number(text, 1)


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected more than 0 seconds, got {text!r}")
    return value


def port_number(text: str) -> int:
    value = non_negative_int(text)
    if not 0 < value < 65536:
        raise argparse.ArgumentTypeError(f"expected a port between 1 and 65535, got {value}")
    return value


@dataclass
class Context:
    broker: RedissonBroker
    out: Output
    args: argparse.Namespace

    @property
    def json_mode(self) -> bool:
        return self.out.json_mode


def duration_arg(text: str) -> int:
    """``--in`` and the like: :func:`.._format.parse_duration` as an argparse type."""
    try:
        return parse_duration(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def time_arg(text: str) -> int:
    """``--at``: :func:`.._format.parse_time` as an argparse type."""
    try:
        return parse_time(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


@dataclass(frozen=True)
class Command:
    """One command as its module declares it, beside its handler.

    Attributes:
      name: What the operator types (``list``, ``acl-rule``).
      help: One line, shown in ``--help`` and as the command's description.
      handler: Runs it; returns the exit status. ``None`` for a group (``dead``).
      arguments: Adds its arguments and options to its parser.
      bulk: It takes ``--yes`` (destructive, asks first).
      actions: A group's commands (``dead list``, ``dead show``, ...), whose parsers take
        the group's ``queue`` argument first.
      description: The group's ``--help`` description (default: ``help``).
      aliases: Other names of an action (``limits show`` for ``limits get``).
      queue_optional: An action whose ``queue`` may be left out (``limits get``: every
        known queue).
    """

    name: str
    help: str
    handler: Callable[[Context], int] | None = None
    arguments: Callable[[argparse.ArgumentParser], None] = lambda parser: None
    bulk: bool = False
    actions: tuple[Command, ...] = ()
    description: str | None = None
    aliases: tuple[str, ...] = ()
    queue_optional: bool = False
