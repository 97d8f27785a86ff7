"""Finding the broker to operate (an import path, or ``--url``), where it connects, its
server's clock, and asking before destructive bulk commands."""

from __future__ import annotations

import argparse
import functools
import importlib
import os
import sys
from collections.abc import Sequence
from typing import Any

from .. import RedissonBroker
from .._format import one_line
from ._base import CONNECT_TIMEOUT, EXIT_NOT_FOUND, SOCKET_TIMEOUT, UsageError
from ._output import Output

#: Options before the command that take a value (to find the broker import path).
_VALUE_OPTIONS = ("--url", "--namespace", "--path", "-P")


def split_broker_path(argv: list[str], commands: Sequence[str]) -> tuple[str | None, list[str]]:
    """Take the broker import path out of ``argv``: the first positional argument before
    the command, when it holds a ``:`` or is not a command's name."""
    index = 0
    while index < len(argv):
        arg = argv[index]
        if arg == "--":
            return None, argv
        if arg.startswith("-"):
            index += 2 if arg in _VALUE_OPTIONS else 1
            continue
        if ":" in arg or arg not in commands:
            return arg, argv[:index] + argv[index + 1 :]
        return None, argv
    return None, argv


def import_broker(path: str, search_paths: Sequence[str], commands: Sequence[str]) -> RedissonBroker:
    """The broker an import path names, as Dramatiq's CLI finds it: ``module:attribute``
    (an attribute that is a callable is called, and its result or the global broker is
    used), or ``module`` for its ``broker`` attribute or else the broker it set as
    Dramatiq's global broker."""
    import dramatiq
    from dramatiq import broker as dramatiq_broker

    for directory in reversed(search_paths):
        directory = os.path.abspath(directory)
        if directory not in sys.path:
            sys.path.insert(0, directory)
    module_name, _, attribute = path.partition(":")
    if not module_name:
        raise UsageError(f"invalid broker import path {path!r}: expected module or module:attribute")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if ":" not in path and e.name is not None and module_name.split(".")[0] == e.name.split(".")[0]:
            raise UsageError(
                f"{path!r} is neither a command ({', '.join(commands)}) nor an importable module"
            ) from None
        raise UsageError(f"cannot import broker module {module_name!r}: {e}") from None
    except Exception as e:
        raise UsageError(f"importing broker module {module_name!r} failed: {type(e).__name__}: {one_line(e)}") from None
    found: Any
    if attribute:
        try:
            found = functools.reduce(getattr, attribute.split("."), module)
        except AttributeError:
            raise UsageError(f"module {module_name!r} has no attribute {attribute!r}") from None
        if callable(found) and not isinstance(found, dramatiq.Broker):
            try:
                result = found()
            except Exception as e:
                raise UsageError(f"calling {path!r} failed: {type(e).__name__}: {one_line(e)}") from None
            found = result if isinstance(result, dramatiq.Broker) else dramatiq_broker.global_broker
    else:
        found = getattr(module, "broker", None)
        if not isinstance(found, dramatiq.Broker):
            found = dramatiq_broker.global_broker
        if found is None:
            raise UsageError(f"module {module_name!r} has no 'broker' and set no global Dramatiq broker")
    if not isinstance(found, RedissonBroker):
        raise UsageError(
            f"{path!r} is a {type(found).__module__}.{type(found).__qualname__}, not a dramatiq_redisson.RedissonBroker"
        )
    return found


def connect(path: str | None, args: argparse.Namespace, commands: Sequence[str]) -> RedissonBroker:
    """The broker to operate: imported from ``path``, or built from ``--url`` / ``$REDIS_URL``."""
    if path is not None:
        if args.url is not None or args.namespace is not None or args.cluster:
            raise UsageError("give either a broker import path or --url/--namespace/--cluster, not both")
        return import_broker(path, args.path or ["."], commands)
    url = args.url or os.environ.get("REDIS_URL")
    if not url:
        raise UsageError("no broker: give an import path (e.g. app.tasks:broker), --url or $REDIS_URL")
    try:
        return RedissonBroker(
            url=url,
            cluster=args.cluster,
            namespace=args.namespace or "dramatiq",
            middleware=[],
            socket_connect_timeout=CONNECT_TIMEOUT,
            socket_timeout=SOCKET_TIMEOUT,
        )
    except ValueError as e:
        raise UsageError(f"invalid --url: {one_line(e)}") from None


def server_address(broker: RedissonBroker) -> str:
    """Where the broker's client connects, without credentials: ``host:port/db``, or on
    a cluster ``cluster:host:port`` of the node it started from."""
    return broker.topology.address()


def server_now(broker: RedissonBroker) -> int:
    """The server's clock in epoch ms (due times are on it)."""
    seconds, micros = broker.client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def confirm(args: argparse.Namespace, action: str) -> bool:
    """Whether to go ahead with a destructive bulk command (``action``, e.g. "cancel every
    scheduled message on queue 'q'"): ``--yes`` says so; else ask on a terminal. Without
    a terminal (a script) and without ``--yes``, refuse (exit 2)."""
    if getattr(args, "yes", False):
        return True
    if not sys.stdin.isatty():
        raise UsageError(f"refusing to {action} without --yes (stdin is not a terminal to ask on)")
    sys.stderr.write(f"{action[0].upper()}{action[1:]}? [y/N] ")
    sys.stderr.flush()
    answer = sys.stdin.readline()
    return answer.strip().lower() in ("y", "yes")


def declined() -> int:
    Output.note("Aborted: nothing was changed.")
    return EXIT_NOT_FOUND
