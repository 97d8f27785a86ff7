"""The ``dramatiq-redisson`` command line: look at and operate a namespace's queues.

Connect like Dramatiq's own CLI, with a broker import path (``app.tasks:broker``, or
``app.tasks`` for the broker that module sets up), or with ``--url`` / ``$REDIS_URL``
and ``--namespace``. Connection options and the import path come before the command::

    dramatiq-redisson app.tasks:broker stats
    dramatiq-redisson --url redis://localhost:6379/0 list default --json

Exit status: 0 on success; 1 when a message id was not found (or a confirmation was
declined), 2 on a usage or connection error (one line on stderr, never a traceback).
Every command takes ``--json`` and then prints one JSON document on stdout (``watch``
prints one per refresh, one per line). Times are on the Redis server's clock; JSON
gives each time as epoch ms (``*_ms``) and as an ISO 8601 UTC string.

Human output uses ``rich`` tables when it is installed (``pip install
-e '.[cli]'`` in a clone), otherwise plain aligned text; ``--plain`` or
``DRAMATIQ_REDISSON_PLAIN=1`` forces plain text. ``--plain`` and ``--json`` go before
or after the command. Colour only goes to a terminal (and never with ``NO_COLOR`` set).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn

import redis

from .. import __version__
from .._format import one_line, parse_duration, span
from . import _acl, _dead, _dev, _limits, _live, _scheduled, _schedules, _serve, _state, _stats, _workflows
from ._base import DEBUG_ENV, EXIT_NOT_FOUND, EXIT_USAGE, PLAIN_ENV, PROG, Command, Context, UsageError
from ._connect import connect, server_address, split_broker_path
from ._output import Output

#: Every command, in the order ``--help`` lists them; each is declared, with its options,
#: beside its handler in the module of its group.
REGISTRY: tuple[Command, ...] = (
    _stats.STATS,
    _scheduled.LIST,
    _scheduled.SHOW,
    _scheduled.CANCEL,
    _scheduled.PROMOTE,
    _scheduled.RESCHEDULE,
    _dead.DEAD,
    _schedules.SCHEDULES,
    _workflows.WORKFLOWS,
    _live.PAUSE,
    _live.RESUME,
    _limits.LIMITS,
    _live.RUNNING,
    _state.STATE,
    _live.HISTORY,
    _stats.WATCH,
    _serve.METRICS,
    _acl.ACL_RULE,
    _serve.DASHBOARD,
    _dev.SERVER,
)

#: The command names.
COMMANDS = tuple(command.name for command in REGISTRY)

#: ``parse_duration`` and ``span`` stay importable from here (they live in :mod:`.._format`).
__all__ = ["COMMANDS", "REGISTRY", "build_parser", "main", "parse_duration", "run", "span"]


class Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line on stderr and exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see --help)\n")


DESCRIPTION = """\
Look at and operate the queues of a dramatiq-redisson broker: counts, scheduled
messages, dead letters, what runs now and what ran; pause and resume queues; set
concurrency limits.

BROKER is a broker import path as Dramatiq's CLI takes it (app.tasks:broker, or
app.tasks for the broker that module sets up); importing it also declares the app's
queues. Without BROKER, connect with --url or $REDIS_URL and --namespace.
A queue named that is not known (declared, sent to or consumed) is refused (exit 2).
`server` needs no broker: it runs an embedded Valkey for development.
"""


EPILOG = """\
examples:
  dramatiq-redisson app.tasks:broker stats
  dramatiq-redisson --url redis://localhost:6379/0 list default --actor send_email
  dramatiq-redisson reschedule default MESSAGE_ID --in 1h30m
  dramatiq-redisson dead requeue default --all --yes
  dramatiq-redisson pause emails
  dramatiq-redisson limits set reports --concurrency 8 --group-concurrency 1
  dramatiq-redisson limits update reports --concurrency 4
  dramatiq-redisson server --port 6390
  dramatiq-redisson history default --minutes 30
  dramatiq-redisson state MESSAGE_ID --json

exit status: 0 success; 1 a message id was not found, or a confirmation was declined;
2 usage or connection error. Times are on the Redis server's clock, shown in UTC.
"""


def build_parser() -> Parser:
    parser = Parser(
        prog=PROG,
        usage="%(prog)s [BROKER] [--url URL] [--namespace NS] [options] COMMAND ...",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--url", help="the Redis URL to connect to (default: $REDIS_URL)")
    parser.add_argument("--namespace", help="the broker's namespace, the prefix of its keys (default: dramatiq)")
    parser.add_argument(
        "--cluster", action="store_true", help="--url names a node of a Redis Cluster (the cluster key layout)"
    )
    parser.add_argument(
        "--path",
        "-P",
        action="append",
        metavar="DIR",
        help="a directory to import BROKER from (repeatable; default: the current directory)",
    )
    parser.add_argument(
        "--plain", action="store_true", help=f"plain text tables, even with rich installed (or ${PLAIN_ENV}=1)"
    )
    parser.add_argument(
        "--json", action="store_true", default=argparse.SUPPRESS, help="print JSON (as each command's --json)"
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")

    # --json and --plain are taken after the command too; SUPPRESS keeps the command's
    # parser from resetting one given before it.
    common = Parser(add_help=False)
    common.add_argument(
        "--json", action="store_true", default=argparse.SUPPRESS, help="print one JSON document on stdout"
    )
    common.add_argument(
        "--plain", action="store_true", default=argparse.SUPPRESS, help="plain text tables, even with rich installed"
    )
    bulk = Parser(add_help=False)
    bulk.add_argument("--yes", "-y", action="store_true", help="do it without asking (required without a terminal)")

    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True, parser_class=Parser, prog=PROG)
    for command in REGISTRY:
        if not command.actions:
            sub = commands.add_parser(
                command.name,
                help=command.help,
                description=command.help,
                parents=[common, *([bulk] if command.bulk else [])],
                formatter_class=argparse.RawDescriptionHelpFormatter,
            )
            sub.set_defaults(handler=command.handler)
            command.arguments(sub)
            continue
        group = commands.add_parser(command.name, help=command.help, description=command.description or command.help)
        actions = group.add_subparsers(
            dest=f"{command.name}_command",
            metavar="ACTION",
            required=True,
            parser_class=Parser,
            prog=f"{PROG} {command.name}",
        )
        for action in command.actions:
            sub = actions.add_parser(
                action.name,
                aliases=list(action.aliases),
                help=action.help,
                description=action.help,
                parents=[common, *([bulk] if action.bulk else [])],
            )
            sub.set_defaults(handler=action.handler)
            if action.queue_optional:
                sub.add_argument("queue", nargs="?", help="only this queue (default: every known queue)")
            else:
                sub.add_argument("queue")
            action.arguments(sub)
    return parser


def run(argv: list[str]) -> int:
    path, rest = split_broker_path(argv, COMMANDS)
    if path is not None and ":" not in path and not any(arg in COMMANDS for arg in rest) and "-h" not in rest:
        if "--help" not in rest and "--version" not in rest:
            raise UsageError(f"unknown command {path!r} (commands: {', '.join(COMMANDS)})")
    args = build_parser().parse_args(rest)
    plain = args.plain or os.environ.get(PLAIN_ENV, "") not in ("", "0")
    out = Output(json_mode=getattr(args, "json", False), plain=plain)
    if args.command == "acl-rule" and args.server_version is not None:
        if path is not None or args.url is not None:
            raise UsageError("acl-rule: give --server-version or a broker (path, --url), not both")
        return _acl.offline_acl_rule(args, out)
    if args.command == _dev.SERVER.name:
        return _dev.run_server(path, args)
    broker = connect(path, args, COMMANDS)
    try:
        handler: Callable[[Context], int] = args.handler
        return handler(Context(broker, out, args))
    except redis.AuthenticationError as e:
        raise UsageError(f"authentication failed at {server_address(broker)}: {one_line(e)}") from None
    except (redis.ConnectionError, redis.TimeoutError) as e:
        raise UsageError(f"cannot reach the Redis server at {server_address(broker)}: {one_line(e)}") from None
    except redis.ResponseError as e:
        raise UsageError(f"the server at {server_address(broker)} refused a command: {one_line(e)}") from None
    except redis.RedisError as e:
        raise UsageError(f"Redis error at {server_address(broker)}: {type(e).__name__}: {one_line(e)}") from None
    except ValueError as e:
        raise UsageError(one_line(e)) from None


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    try:
        return run(list(sys.argv[1:] if argv is None else argv))
    except UsageError as e:
        sys.stderr.write(f"{PROG}: error: {e}\n")
        return EXIT_USAGE
    except KeyboardInterrupt:
        sys.stderr.write("Interrupted.\n")
        return 130
    except BrokenPipeError:
        # The reader went away (`| head`): stop quietly, without a second error at exit.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_NOT_FOUND
    except Exception as e:
        if os.environ.get(DEBUG_ENV, "") not in ("", "0"):
            raise
        sys.stderr.write(
            f"{PROG}: error: unexpected {type(e).__name__}: {one_line(e)} (set {DEBUG_ENV}=1 for the traceback)\n"
        )
        return EXIT_USAGE
