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
'dramatiq-redisson[cli]'``), otherwise plain aligned text; ``--plain`` or
``DRAMATIQ_REDISSON_PLAIN=1`` forces plain text. Colour only goes to a terminal
(and never with ``NO_COLOR`` set).
"""

from __future__ import annotations

import argparse
import datetime
import functools
import importlib
import itertools
import json
import logging
import os
import re
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn, cast

import redis
from dramatiq.message import Message

from . import __version__
from ._broker import MAX_DELAY, RedissonBroker
from ._delayed_queue import DelayedQueue
from ._permissions import acl_rule
from ._server import describe as describe_server
from ._server import parse_version
from ._stats import QueueStats, Stats

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
#: Widest the arguments column of a table gets before it is cut with "…".
ARGS_WIDTH = 60

COMMANDS = (
    "stats",
    "list",
    "show",
    "cancel",
    "reschedule",
    "promote",
    "dead",
    "watch",
    "metrics",
    "dashboard",
    "acl-rule",
)
#: Options before the command that take a value (to find the broker import path).
_VALUE_OPTIONS = ("--url", "--namespace", "--path", "-P")


class UsageError(Exception):
    """A problem the operator can fix: reported as one line on stderr, exit status 2."""


# -- times and sizes -------------------------------------------------------------------


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
        raise argparse.ArgumentTypeError(f"duration {text!r} needs a unit, e.g. {compact}s or {compact}ms")
    if not _DURATION.fullmatch(compact):
        raise argparse.ArgumentTypeError(
            f"invalid duration {text!r}: use a number and a unit (ms, s, m, h, d, w), e.g. 90s, 10m, 1h30m, 2d"
        )
    ms = round(sum(float(number) * _UNIT_MS[unit] for number, unit in _DURATION_PART.findall(compact)))
    if ms > MAX_DELAY:
        raise argparse.ArgumentTypeError(f"duration {text!r} is longer than the longest delay (ten years)")
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
        raise argparse.ArgumentTypeError(
            f"invalid time {text!r}: use ISO 8601 with a timezone, e.g. 2026-12-01T08:00Z or 2026-12-01T09:00+01:00"
        ) from None
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise argparse.ArgumentTypeError(
            f"time {text!r} has no timezone: add Z for UTC or an offset: 2026-12-01T08:00Z, 2026-12-01T09:00+01:00"
        )
    return max(0, int(moment.timestamp() * 1000))


def non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected 0 or more, got {value}")
    return value


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


# -- JSON documents --------------------------------------------------------------------


def message_doc(message: Message[Any]) -> dict[str, Any]:
    """A message's fields, JSON-ready."""
    return {
        "message_id": message.message_id,
        "queue_name": message.queue_name,
        "actor_name": message.actor_name,
        "args": list(message.args),
        "kwargs": dict(message.kwargs),
        "options": dict(message.options),
        "message_timestamp": message.message_timestamp,
        "enqueued": iso(message.message_timestamp),
    }


def scheduled_doc(due_ms: int, message: Message[Any], now_ms: int) -> dict[str, Any]:
    """A scheduled message: its fields and its due time."""
    doc = message_doc(message)
    doc.update(due_ms=due_ms, due=iso(due_ms), due_in_ms=due_ms - now_ms)
    return doc


def dead_doc(died_ms: int, message: Message[Any], now_ms: int) -> dict[str, Any]:
    """A dead letter: its fields, its redis message id and its time of death."""
    doc = message_doc(message)
    doc.update(
        redis_message_id=message.options.get("redis_message_id"),
        died_ms=died_ms,
        died=iso(died_ms),
        died_ago_ms=now_ms - died_ms,
        error=last_error(message),
    )
    return doc


def stats_doc(stats: Stats, namespace: str) -> dict[str, Any]:
    """:meth:`RedissonBroker.stats` with ISO times and relative due times added."""
    now = stats["time_ms"]
    queues: dict[str, dict[str, Any]] = {}
    for name, counts in stats["queues"].items():
        entry: dict[str, Any] = dict(counts)
        due = counts["next_due_ms"]
        entry["next_due"] = iso(due)
        entry["next_due_in_ms"] = None if due is None else due - now
        queues[name] = entry
    return {"namespace": namespace, "time_ms": now, "time": iso(now), "workers": stats["workers"], "queues": queues}


def last_error(message: Message[Any]) -> str | None:
    """The last line of the traceback Dramatiq's ``Retries`` stored, if any."""
    text = message.options.get("traceback")
    if not isinstance(text, str):
        return None
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else None


def call_text(message: Message[Any], width: int = ARGS_WIDTH) -> str:
    """A message's arguments as in a call, cut to ``width``: ``1, "x", tag="a"``."""

    def value(v: Any) -> str:
        return json.dumps(v, ensure_ascii=False, default=str, separators=(",", ":"))

    parts = [value(a) for a in message.args] + [f"{k}={value(v)}" for k, v in message.kwargs.items()]
    return shorten(", ".join(parts), width)


def shorten(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


# -- output ----------------------------------------------------------------------------


@dataclass
class Cell:
    text: str
    style: str | None = None


@dataclass
class Table:
    """A table to print with rich or as plain aligned text."""

    headers: list[str]
    #: Column indexes aligned right (numbers).
    numeric: set[int] = field(default_factory=set)
    rows: list[list[Cell]] = field(default_factory=list)

    def add(self, *cells: str | Cell) -> None:
        self.rows.append([cell if isinstance(cell, Cell) else Cell(cell) for cell in cells])


#: What a command prints for people: lines (with an optional style) and tables.
Block = Cell | Table


class Output:
    """Prints JSON documents, lines and tables on stdout; notes and errors on stderr."""

    def __init__(self, *, json_mode: bool, plain: bool) -> None:
        self.json_mode = json_mode
        self.console: Any = None
        if not plain and not json_mode:
            try:
                from rich.console import Console
            except ImportError:
                pass
            else:
                terminal = sys.stdout.isatty()
                # Off a terminal rich would wrap at 80 columns: let tables take their width.
                self.console = Console(highlight=False, width=None if terminal else 4096, soft_wrap=not terminal)

    def json(self, document: Any) -> None:
        sys.stdout.write(json.dumps(document, default=str) + "\n")
        sys.stdout.flush()

    def blocks(self, blocks: Sequence[Block]) -> None:
        if self.console is not None and self.console.is_terminal:
            self.console.print(self.renderable(blocks))
        elif self.console is not None:
            # rich pads every cell to its column's width: drop the trailing spaces.
            with self.console.capture() as captured:
                self.console.print(self.renderable(blocks))
            sys.stdout.write("".join(line.rstrip() + "\n" for line in captured.get().splitlines()))
        else:
            sys.stdout.write("".join(line + "\n" for line in plain_lines(blocks)))
        sys.stdout.flush()

    def line(self, text: str, style: str | None = None) -> None:
        self.blocks([Cell(text, style)])

    @staticmethod
    def note(text: str) -> None:
        """A line for the operator on stderr (not part of the command's output)."""
        sys.stderr.write(text + "\n")
        sys.stderr.flush()

    def renderable(self, blocks: Sequence[Block]) -> Any:
        from rich import box
        from rich.console import Group
        from rich.table import Table as RichTable
        from rich.text import Text

        parts: list[Any] = []
        for block in blocks:
            if isinstance(block, Cell):
                parts.append(Text(block.text, style=block.style or ""))
                continue
            table = RichTable(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, header_style="bold")
            for index, header in enumerate(block.headers):
                table.add_column(header, justify="right" if index in block.numeric else "left", no_wrap=True)
            for row in block.rows:
                table.add_row(*(Text(cell.text, style=cell.style or "") for cell in row))
            parts.append(table)
        return Group(*parts)


def plain_lines(blocks: Sequence[Block]) -> list[str]:
    """Blocks as plain text: tables with columns two spaces apart, a dashed rule under
    the headers, numbers aligned right."""
    lines: list[str] = []
    for block in blocks:
        if isinstance(block, Cell):
            lines.append(block.text)
            continue
        texts = [block.headers] + [[cell.text for cell in row] for row in block.rows]
        widths = [max(len(row[i]) for row in texts) for i in range(len(block.headers))]

        def fmt(row: list[str], block: Table = block, widths: list[int] = widths) -> str:
            cells = [
                text.rjust(width) if i in block.numeric else text.ljust(width)
                for i, (text, width) in enumerate(zip(row, widths, strict=True))
            ]
            return "  ".join(cells).rstrip()

        lines.append(fmt(block.headers))
        lines.append("  ".join("-" * width for width in widths))
        lines.extend(fmt(row) for row in texts[1:])
    return lines


# -- connecting --------------------------------------------------------------------------


def split_broker_path(argv: list[str]) -> tuple[str | None, list[str]]:
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
        if ":" in arg or arg not in COMMANDS:
            return arg, argv[:index] + argv[index + 1 :]
        return None, argv
    return None, argv


def import_broker(path: str, search_paths: Sequence[str]) -> RedissonBroker:
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
                f"{path!r} is neither a command ({', '.join(COMMANDS)}) nor an importable module"
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


def connect(path: str | None, args: argparse.Namespace) -> RedissonBroker:
    """The broker to operate: imported from ``path``, or built from ``--url`` / ``$REDIS_URL``."""
    if path is not None:
        if args.url is not None or args.namespace is not None or args.cluster:
            raise UsageError("give either a broker import path or --url/--namespace/--cluster, not both")
        return import_broker(path, args.path or ["."])
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
    if broker.cluster:
        node = cast(Any, broker.client).get_default_node()
        return f"cluster:{node.host}:{node.port}"
    kwargs = broker.client.connection_pool.connection_kwargs
    if "path" in kwargs:
        return f"unix:{kwargs['path']}"
    return f"{kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}/{kwargs.get('db', 0)}"


def server_now(broker: RedissonBroker) -> int:
    """The server's clock in epoch ms (due times are on it)."""
    seconds, micros = broker.client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def one_line(error: BaseException | str) -> str:
    return " ".join(str(error).split()) or type(error).__name__


# -- confirmation ------------------------------------------------------------------------


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


# -- commands ----------------------------------------------------------------------------


@dataclass
class Context:
    broker: RedissonBroker
    out: Output
    args: argparse.Namespace

    @property
    def json_mode(self) -> bool:
        return self.out.json_mode


def stats_blocks(stats: Stats, namespace: str) -> list[Block]:
    now = stats["time_ms"]
    workers = stats["workers"]
    header = Cell(
        f"Server time {iso(now, precise=False)} · namespace {namespace!r} · "
        f"{workers} live worker{'s' if workers != 1 else ''}",
        "bold",
    )
    if not stats["queues"]:
        return [
            header,
            Cell(
                "No known queues: name one (stats QUEUE), or give the app's broker import path to "
                "declare its queues; queues also become known once a worker has consumed them."
            ),
        ]
    legacy = any(q["legacy_delayed"] for q in stats["queues"].values())
    headers = ["queue", "ready", "in flight", "scheduled", "overdue", "next due", "dead", "consumers", "lease holder"]
    if legacy:
        headers.append("legacy .DQ")
    table = Table(headers, numeric={1, 2, 3, 4, 6, 7, 9})
    for name, q in stats["queues"].items():
        table.add(*queue_row(name, q, now, legacy))
    return [header, table]


def queue_row(name: str, q: QueueStats, now: int, legacy: bool) -> list[Cell]:
    due = q["next_due_ms"]
    if due is None:
        next_due = Cell("-", "dim")
    else:
        next_due = Cell(f"{iso(due, precise=False)} ({until(due, now)})", "red" if due < now - 1000 else None)
    stuck = q["overdue"] > 0 and q["consumers"] == 0
    row = [
        Cell(name, "bold"),
        Cell(str(q["ready"])),
        Cell(str(q["in_flight"])),
        Cell(str(q["scheduled"])),
        Cell(str(q["overdue"]), "bold red" if q["overdue"] else None),
        next_due,
        Cell(str(q["dead"]), "yellow" if q["dead"] else None),
        Cell(str(q["consumers"]), "bold red" if stuck else None),
        Cell(q["transfer_holder"] or "-", None if q["transfer_holder"] else "dim"),
    ]
    if legacy:
        row.append(Cell(str(q["legacy_delayed"]), "yellow" if q["legacy_delayed"] else None))
    return row


def cmd_stats(ctx: Context) -> int:
    stats = ctx.broker.stats(ctx.args.queue)
    if ctx.json_mode:
        ctx.out.json(stats_doc(stats, ctx.broker.namespace))
    else:
        ctx.out.blocks(stats_blocks(stats, ctx.broker.namespace))
    return EXIT_OK


def acl_rule_output(out: Output, rule: str, server: str, *, namespace: str, cluster: bool, user: str = "<user>") -> int:
    """Print an ACL rule as the ACL SETUSER command to apply (``--json``: a document)."""
    command = f"ACL SETUSER {user} on ><password> {rule}"
    if out.json_mode:
        out.json({"server": server, "namespace": namespace, "cluster": cluster, "rule": rule, "command": command})
    else:
        out.note(f"Least-privilege rule for {server}{' (on every node of the cluster)' if cluster else ''}:")
        sys.stdout.write(command + "\n")
    return EXIT_OK


def cmd_acl_rule(ctx: Context) -> int:
    broker, args = ctx.broker, ctx.args
    rule = broker.acl_rule(wait_for_replicas=True if args.wait_for_replicas else None)
    name, version = min(broker.check_server().values(), key=lambda entry: entry[1])
    server = describe_server(name, version)
    return acl_rule_output(ctx.out, rule, server, namespace=broker.namespace, cluster=broker.cluster, user=args.user)


def offline_acl_rule(args: argparse.Namespace, out: Output) -> int:
    """``acl-rule --server-version X.Y[.Z]`` without a broker: the rule for that version."""
    version = parse_version(args.server_version)
    if version < (6, 2, 0):
        raise UsageError(f"--server-version {args.server_version}: the broker needs Redis >= 6.2 or Valkey")
    namespace = args.namespace or "dramatiq"
    rule = acl_rule(namespace, cluster=args.cluster, wait_for_replicas=args.wait_for_replicas, server_version=version)
    server = f"server version {'.'.join(map(str, version))}"
    return acl_rule_output(out, rule, server, namespace=namespace, cluster=args.cluster, user=args.user)


def take(items: Iterator[Any], limit: int) -> tuple[list[Any], bool]:
    """At most ``limit`` items (0: all), and whether there were more."""
    if limit == 0:
        return list(items), False
    taken = list(itertools.islice(items, limit + 1))
    return taken[:limit], len(taken) > limit


def cmd_list(ctx: Context) -> int:
    args = ctx.args
    dq = ctx.broker.delayed_queue(args.queue)
    now = server_now(ctx.broker)
    total = dq.size()
    batch = 1000 if args.limit == 0 else min(1000, args.limit + 1)
    entries, truncated = take(dq.scan(actor_name=args.actor, match=args.match, batch=batch), args.limit)
    if ctx.json_mode:
        ctx.out.json(
            {
                "queue": args.queue,
                "time_ms": now,
                "time": iso(now),
                "scheduled": total,
                "count": len(entries),
                "truncated": truncated,
                "messages": [scheduled_doc(due, message, now) for due, message in entries],
            }
        )
        return EXIT_OK
    filters = [f"actor {args.actor!r}" if args.actor else "", f"matching {args.match!r}" if args.match else ""]
    what = " and ".join(f for f in filters if f)
    title = f"Scheduled on {args.queue!r}: {total} in all" + (f"; {what}" if what else "")
    title += f" · server time {iso(now, precise=False)}"
    blocks: list[Block] = [Cell(title, "bold")]
    if not entries:
        blocks.append(Cell("Nothing scheduled." if not what else "No scheduled message matches."))
        ctx.out.blocks(blocks)
        return EXIT_OK
    table = Table(["due (UTC)", "when", "message id", "actor", "retries", "arguments"], numeric={4})
    for due, message in entries:
        table.add(
            iso(due, precise=False) or "",
            Cell(until(due, now), "red" if due < now - 1000 else None),
            message.message_id,
            Cell(message.actor_name, "cyan"),
            str(message.options.get("retries", 0)),
            call_text(message),
        )
    blocks.append(table)
    if truncated:
        blocks.append(Cell(f"Showing the first {len(entries)} in due order; --limit 0 lists all.", "dim"))
    ctx.out.blocks(blocks)
    return EXIT_OK


def detail_blocks(title: str, fields: list[tuple[str, str]], doc: dict[str, Any]) -> list[Block]:
    """One message in full: a title, its main fields, its options as indented JSON."""
    blocks: list[Block] = [Cell(title, "bold")]
    width = max(len(name) for name, _ in fields + [("options", "")])
    base = [
        ("message id", doc["message_id"]),
        ("queue", doc["queue_name"]),
        ("actor", doc["actor_name"]),
        ("args", json.dumps(doc["args"], ensure_ascii=False, default=str)),
        ("kwargs", json.dumps(doc["kwargs"], ensure_ascii=False, default=str)),
        ("enqueued", f"{doc['enqueued']} ({doc['message_timestamp']})"),
    ]
    width = max(width, *(len(name) for name, _ in base))
    for name, value in fields + base:
        blocks.append(Cell(f"  {name.ljust(width)}  {value}"))
    options = {k: v for k, v in doc["options"].items() if k != "traceback"}
    rendered = json.dumps(options, indent=2, sort_keys=True, ensure_ascii=False, default=str)
    blocks.append(Cell(f"  {'options'.ljust(width)}  " + rendered.replace("\n", "\n  " + " " * (width + 2))))
    traceback = doc["options"].get("traceback")
    if isinstance(traceback, str):
        blocks.append(Cell("  traceback:"))
        blocks.append(Cell("\n".join("    " + line for line in traceback.rstrip().splitlines()), "red"))
    return blocks


def cmd_show(ctx: Context) -> int:
    args = ctx.args
    now = server_now(ctx.broker)
    found = ctx.broker.delayed_queue(args.queue).get(args.message_id)
    if found is None:
        if ctx.json_mode:
            ctx.out.json({"queue": args.queue, "message_id": args.message_id, "found": False})
        Output.note(
            f"not scheduled: {args.message_id} on queue {args.queue!r} (it moved to the ready queue, "
            "was cancelled, or never was)"
        )
        return EXIT_NOT_FOUND
    due, message = found
    doc = scheduled_doc(due, message, now)
    if ctx.json_mode:
        ctx.out.json(
            {
                "queue": args.queue,
                "message_id": args.message_id,
                "found": True,
                "time_ms": now,
                "time": iso(now),
                "message": doc,
            }
        )
        return EXIT_OK
    fields = [("due", f"{doc['due']} ({until(due, now)})"), ("retries", str(message.options.get("retries", 0)))]
    ctx.out.blocks(detail_blocks(f"Scheduled message {message.message_id} on {args.queue!r}", fields, doc))
    return EXIT_OK


def check_ids_or_all(ctx: Context, verb: str, actor: bool = True) -> None:
    args = ctx.args
    if args.all and args.ids:
        raise UsageError(f"{verb}: give message ids or --all, not both")
    if not args.all and not args.ids:
        raise UsageError(f"{verb}: give one or more message ids, or --all")
    if actor and args.actor and not args.all:
        raise UsageError(f"{verb}: --actor goes with --all")


def report_ids(ctx: Context, key: str, verb: str, done: list[str], missing: list[str], missing_what: str) -> int:
    """Print what an id-addressed command did; exit 1 if any id was not found."""
    if ctx.json_mode:
        ctx.out.json({"queue": ctx.args.queue, "count": len(done), key: done, "not_found": missing})
    else:
        for message_id in done:
            ctx.out.line(f"{verb} {message_id}")
    for message_id in missing:
        Output.note(f"{missing_what}: {message_id} on queue {ctx.args.queue!r}")
    return EXIT_NOT_FOUND if missing else EXIT_OK


def report_all(ctx: Context, count: int, text: str) -> int:
    """Print what an ``--all`` command did."""
    if ctx.json_mode:
        document = {"queue": ctx.args.queue, "count": count, "all": True}
        if "actor" in ctx.args:
            document["actor_name"] = ctx.args.actor
        ctx.out.json(document)
    else:
        ctx.out.line(text)
    return EXIT_OK


def plural(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def actor_suffix(actor: str | None) -> str:
    return f" of actor {actor!r}" if actor else ""


def _act_on_scheduled(
    ctx: Context,
    verb: str,
    prompt: str,
    act_all: Callable[..., int],
    act_one: Callable[[DelayedQueue, str], bool],
    summary: str,
    past: str,
    shown: str,
) -> int:
    """``cancel``/``promote``: the ids given, or ``--all`` (``--actor``) after asking.
    ``prompt`` has ``{actor}`` and ``{queue}`` fields, ``summary`` ``{count}`` and
    ``{queue}``; ``act_all``/``act_one``: the :class:`DelayedQueue` methods to call."""
    args = ctx.args
    check_ids_or_all(ctx, verb)
    dq = ctx.broker.delayed_queue(args.queue)
    if args.all:
        if not confirm(args, prompt.format(actor=actor_suffix(args.actor), queue=repr(args.queue))):
            return declined()
        count = act_all(dq, actor_name=args.actor)
        return report_all(ctx, count, summary.format(count=plural(count, "scheduled message"), queue=repr(args.queue)))
    done: list[str] = []
    missing: list[str] = []
    for message_id in dict.fromkeys(args.ids):
        (done if act_one(dq, message_id) else missing).append(message_id)
    return report_ids(ctx, past, shown, done, missing, "not scheduled")


def cmd_cancel(ctx: Context) -> int:
    return _act_on_scheduled(
        ctx,
        "cancel",
        "cancel every scheduled message{actor} on queue {queue}",
        DelayedQueue.remove_all,
        DelayedQueue.remove,
        "Cancelled {count} on {queue}.",
        "cancelled",
        "cancelled",
    )


def cmd_promote(ctx: Context) -> int:
    return _act_on_scheduled(
        ctx,
        "promote",
        "run every scheduled message{actor} on queue {queue} now",
        DelayedQueue.promote_all,
        DelayedQueue.promote,
        "Promoted {count} on {queue}: due now.",
        "promoted",
        "promoted (due now)",
    )


def cmd_reschedule(ctx: Context) -> int:
    args = ctx.args
    dq = ctx.broker.delayed_queue(args.queue)
    if args.in_ is not None:
        moved = dq.reschedule(args.message_id, delay=args.in_)
    else:
        moved = dq.reschedule(args.message_id, at=args.at)
    found = dq.get(args.message_id) if moved else None
    now = server_now(ctx.broker)
    if not moved:
        if ctx.json_mode:
            ctx.out.json({"queue": args.queue, "message_id": args.message_id, "rescheduled": False})
        Output.note(f"not scheduled: {args.message_id} on queue {args.queue!r}")
        return EXIT_NOT_FOUND
    due = found[0] if found is not None else None
    if ctx.json_mode:
        ctx.out.json(
            {
                "queue": args.queue,
                "message_id": args.message_id,
                "rescheduled": True,
                "due_ms": due,
                "due": iso(due),
                "due_in_ms": None if due is None else due - now,
            }
        )
    elif due is None:
        ctx.out.line(f"rescheduled {args.message_id}: already due and moved to the ready queue")
    else:
        ctx.out.line(f"rescheduled {args.message_id}: due {iso(due, precise=False)} ({until(due, now)})")
    return EXIT_OK


def cmd_dead_list(ctx: Context) -> int:
    args = ctx.args
    dl = ctx.broker.dead_letters(args.queue)
    now = server_now(ctx.broker)
    total = dl.size()
    entries = dl.read_all(None if args.limit == 0 else args.limit + 1)
    truncated = args.limit != 0 and len(entries) > args.limit
    if truncated:
        entries = entries[: args.limit]
    if ctx.json_mode:
        ctx.out.json(
            {
                "queue": args.queue,
                "time_ms": now,
                "time": iso(now),
                "dead": total,
                "count": len(entries),
                "truncated": truncated,
                "messages": [dead_doc(died, message, now) for died, message in entries],
            }
        )
        return EXIT_OK
    blocks: list[Block] = [
        Cell(f"Dead letters of {args.queue!r}: {total} · server time {iso(now, precise=False)}", "bold")
    ]
    if not entries:
        blocks.append(Cell("No dead letters."))
        ctx.out.blocks(blocks)
        return EXIT_OK
    table = Table(["died (UTC)", "when", "id", "actor", "retries", "last error", "arguments"], numeric={4})
    for died, message in entries:
        table.add(
            iso(died, precise=False) or "",
            ago(died, now),
            str(message.options.get("redis_message_id", message.message_id)),
            Cell(message.actor_name, "cyan"),
            str(message.options.get("retries", 0)),
            Cell(shorten(last_error(message) or "-", 50), "red"),
            call_text(message, 40),
        )
    blocks.append(table)
    if truncated:
        blocks.append(Cell(f"Showing the oldest {len(entries)}; --limit 0 lists all.", "dim"))
    ctx.out.blocks(blocks)
    return EXIT_OK


def cmd_dead_show(ctx: Context) -> int:
    args = ctx.args
    now = server_now(ctx.broker)
    found = ctx.broker.dead_letters(args.queue).get(args.message_id)
    if found is None:
        if ctx.json_mode:
            ctx.out.json({"queue": args.queue, "message_id": args.message_id, "found": False})
        Output.note(f"no dead letter {args.message_id} on queue {args.queue!r}")
        return EXIT_NOT_FOUND
    died, message = found
    doc = dead_doc(died, message, now)
    if ctx.json_mode:
        ctx.out.json(
            {
                "queue": args.queue,
                "message_id": args.message_id,
                "found": True,
                "time_ms": now,
                "time": iso(now),
                "message": doc,
            }
        )
        return EXIT_OK
    fields = [
        ("id", str(doc["redis_message_id"])),
        ("died", f"{doc['died']} ({ago(died, now)})"),
        ("retries", str(message.options.get("retries", 0))),
        ("last error", doc["error"] or "-"),
    ]
    ctx.out.blocks(detail_blocks(f"Dead letter {args.message_id} on {args.queue!r}", fields, doc))
    return EXIT_OK


def cmd_dead_requeue(ctx: Context) -> int:
    args = ctx.args
    check_ids_or_all(ctx, "dead requeue", actor=False)
    dl = ctx.broker.dead_letters(args.queue)
    if args.all:
        if not confirm(args, f"requeue every dead letter of queue {args.queue!r}"):
            return declined()
        count = dl.requeue_all()
        return report_all(ctx, count, f"Requeued {plural(count, 'dead letter')} of {args.queue!r}.")
    done: list[str] = []
    missing: list[str] = []
    for message_id in dict.fromkeys(args.ids):
        (done if dl.requeue(message_id) else missing).append(message_id)
    return report_ids(ctx, "requeued", "requeued", done, missing, "no dead letter")


def cmd_dead_purge(ctx: Context) -> int:
    args = ctx.args
    check_ids_or_all(ctx, "dead purge", actor=False)
    dl = ctx.broker.dead_letters(args.queue)
    what = "every dead letter" if args.all else f"{len(set(args.ids))} dead letter(s)"
    if not confirm(args, f"delete {what} of queue {args.queue!r} for good"):
        return declined()
    if args.all:
        count = dl.clear()
        return report_all(ctx, count, f"Deleted {plural(count, 'dead letter')} of {args.queue!r}.")
    done: list[str] = []
    missing: list[str] = []
    for message_id in dict.fromkeys(args.ids):
        (done if dl.remove(message_id) else missing).append(message_id)
    return report_ids(ctx, "removed", "deleted", done, missing, "no dead letter")


def cmd_watch(ctx: Context) -> int:
    args = ctx.args
    broker = ctx.broker
    refreshes = itertools.count(1) if args.count == 0 else iter(range(1, args.count + 1))
    live: Any = None
    if not ctx.json_mode and ctx.out.console is not None and sys.stdout.isatty():
        from rich.live import Live

        live = Live(console=ctx.out.console, auto_refresh=False)
        live.start()
    try:
        failing = False
        for refresh in refreshes:
            if refresh > 1:
                time.sleep(args.interval)
            try:
                stats = broker.stats(args.queue)
            except (redis.ConnectionError, redis.TimeoutError) as e:
                if refresh == 1 or isinstance(e, redis.AuthenticationError):
                    raise
                if not failing:  # keep watching across a server restart
                    Output.note(f"lost the server ({one_line(e)}); retrying every {args.interval:g}s")
                failing = True
                continue
            failing = False
            if ctx.json_mode:
                ctx.out.json(stats_doc(stats, broker.namespace))
                continue
            footer = Cell(f"refresh {refresh} · every {args.interval:g}s · Ctrl-C exits", "dim")
            blocks = stats_blocks(stats, broker.namespace) + [footer]
            if live is not None:
                live.update(ctx.out.renderable(blocks), refresh=True)
            else:
                ctx.out.blocks(blocks + ([Cell("")] if args.count != refresh else []))
    except KeyboardInterrupt:
        pass
    finally:
        if live is not None:
            live.stop()
    return EXIT_OK


def cmd_metrics(ctx: Context) -> int:
    args = ctx.args
    needs = "the metrics command needs prometheus-client (pip install 'dramatiq-redisson[metrics]')"
    try:
        metrics = importlib.import_module("dramatiq_redisson.metrics")
        importlib.import_module("prometheus_client")
    except ImportError as e:
        raise UsageError(f"{needs}: {one_line(e)}") from None
    serve: Callable[..., Any] = metrics.serve
    url = f"http://{args.host}:{args.port}/metrics"
    if ctx.json_mode:
        ctx.out.json({"host": args.host, "port": args.port, "url": url})
    Output.note(f"Serving Prometheus metrics of namespace {ctx.broker.namespace!r} on {url} (Ctrl-C stops)")
    try:
        serve(ctx.broker, host=args.host, port=args.port)
    except KeyboardInterrupt:
        pass
    except ImportError as e:
        raise UsageError(f"{needs}: {one_line(e)}") from None
    except OSError as e:
        raise UsageError(f"cannot serve metrics on {args.host}:{args.port}: {one_line(e)}") from None
    return EXIT_OK


def cmd_dashboard(ctx: Context) -> int:
    args = ctx.args
    needs = "the dashboard needs Jinja2 (pip install 'dramatiq-redisson[dashboard]')"
    auth = None
    if args.user is not None:
        password = os.environ.get(args.password_env or "")
        if not args.password_env or not password:
            raise UsageError(
                f"--user needs --password-env naming a set, non-empty environment variable, not {args.password_env!r}"
            )
        auth = (args.user, password)
    elif args.password_env is not None:
        raise UsageError("--password-env needs --user")

    def ready(url: str) -> None:
        if ctx.json_mode:
            ctx.out.json({"url": url, "read_only": args.read_only})
        Output.note(
            f"Serving the dashboard of namespace {ctx.broker.namespace!r} on {url}"
            f"{' (read-only)' if args.read_only else ''} (Ctrl-C stops)"
        )

    try:
        dashboard = importlib.import_module("dramatiq_redisson.dashboard")
        options = {"prefix": args.prefix, "read_only": args.read_only, "auth": auth}
        dashboard.serve(ctx.broker, args.host, args.port, ready=ready, **options)
    except ImportError as e:
        raise UsageError(f"{needs}: {one_line(e)}") from None
    except OSError as e:
        raise UsageError(f"cannot serve the dashboard on {args.host}:{args.port}: {one_line(e)}") from None
    return EXIT_OK


# -- the parser ----------------------------------------------------------------------------


class Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line on stderr and exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see --help)\n")


DESCRIPTION = """\
Look at and operate the queues of a dramatiq-redisson broker: counts, scheduled
messages and dead letters.

BROKER is a broker import path as Dramatiq's CLI takes it (app.tasks:broker, or
app.tasks for the broker that module sets up); importing it also declares the app's
queues. Without BROKER, connect with --url or $REDIS_URL and --namespace.
"""

EPILOG = """\
examples:
  dramatiq-redisson app.tasks:broker stats
  dramatiq-redisson --url redis://localhost:6379/0 list default --actor send_email
  dramatiq-redisson reschedule default MESSAGE_ID --in 1h30m
  dramatiq-redisson dead requeue default --all --yes

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

    common = Parser(add_help=False)
    common.add_argument(
        "--json", action="store_true", default=argparse.SUPPRESS, help="print one JSON document on stdout"
    )
    bulk = Parser(add_help=False)
    bulk.add_argument("--yes", "-y", action="store_true", help="do it without asking (required without a terminal)")

    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True, parser_class=Parser, prog=PROG)

    def command(name: str, help: str, handler: Callable[[Context], int], parents: Sequence[Any] = ()) -> Parser:
        sub: Parser = commands.add_parser(
            name,
            help=help,
            description=help,
            parents=[common, *parents],
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        sub.set_defaults(handler=handler)
        return sub

    sub = command("stats", "counts of every known queue (or one) and the live workers", cmd_stats)
    sub.add_argument("queue", nargs="?", help="only this queue")

    sub = command("list", "scheduled messages of a queue, in due order", cmd_list)
    sub.add_argument("queue")
    sub.add_argument("--actor", help="only this actor's messages")
    sub.add_argument("--match", metavar="TEXT", help="only messages whose encoded form contains TEXT")
    sub.add_argument(
        "--limit",
        type=non_negative_int,
        default=DEFAULT_LIMIT,
        help=f"show at most N (default {DEFAULT_LIMIT}; 0: all)",
    )

    sub = command("show", "one scheduled message in full", cmd_show)
    sub.add_argument("queue")
    sub.add_argument("message_id", metavar="ID")

    for name, help, handler in (
        ("cancel", "cancel scheduled messages (ids, or --all [--actor A])", cmd_cancel),
        ("promote", "run scheduled messages now (ids, or --all [--actor A])", cmd_promote),
    ):
        sub = command(name, help, handler, [bulk])
        sub.add_argument("queue")
        sub.add_argument("ids", nargs="*", metavar="ID")
        sub.add_argument("--all", action="store_true", help="every scheduled message of the queue (asks first)")
        sub.add_argument("--actor", help="with --all: only this actor's messages")

    sub = command("reschedule", "move a scheduled message to a new due time", cmd_reschedule)
    sub.add_argument("queue")
    sub.add_argument("message_id", metavar="ID")
    when = sub.add_mutually_exclusive_group(required=True)
    when.add_argument(
        "--in",
        dest="in_",
        type=parse_duration,
        metavar="DURATION",
        help="due this long from now: 90s, 10m, 1h30m, 2d, 500ms",
    )
    when.add_argument(
        "--at", type=parse_time, metavar="TIME", help="due at an ISO 8601 time with a timezone: 2026-12-01T08:00Z"
    )

    dead = commands.add_parser(
        "dead", help="dead letters: list, show, requeue, purge", description="Dead letters of a queue."
    )
    dead_commands = dead.add_subparsers(
        dest="dead_command", metavar="ACTION", required=True, parser_class=Parser, prog=f"{PROG} dead"
    )

    def dead_command(name: str, help: str, handler: Callable[[Context], int], parents: Sequence[Any] = ()) -> Parser:
        sub: Parser = dead_commands.add_parser(name, help=help, description=help, parents=[common, *parents])
        sub.set_defaults(handler=handler)
        sub.add_argument("queue")
        return sub

    sub = dead_command("list", "dead letters of a queue, oldest first", cmd_dead_list)
    sub.add_argument(
        "--limit",
        type=non_negative_int,
        default=DEFAULT_LIMIT,
        help=f"show at most N (default {DEFAULT_LIMIT}; 0: all)",
    )
    sub = dead_command("show", "one dead letter in full, with its traceback", cmd_dead_show)
    sub.add_argument("message_id", metavar="ID", help="its redis message id (the id column of dead list)")
    for name, help, handler in (
        ("requeue", "put dead letters back on the ready queue (ids, or --all)", cmd_dead_requeue),
        ("purge", "delete dead letters for good (ids, or --all; always asks)", cmd_dead_purge),
    ):
        sub = dead_command(name, help, handler, [bulk])
        sub.add_argument("ids", nargs="*", metavar="ID")
        sub.add_argument("--all", action="store_true", help="every dead letter of the queue")

    sub = command("watch", "stats, refreshed until Ctrl-C", cmd_watch)
    sub.add_argument("queue", nargs="?", help="only this queue")
    sub.add_argument(
        "--interval", type=positive_float, default=2.0, metavar="S", help="seconds between refreshes (default 2)"
    )
    sub.add_argument(
        "--count", type=non_negative_int, default=0, metavar="N", help="stop after N refreshes (default 0: never)"
    )

    sub = command("metrics", "serve Prometheus metrics of the queues over HTTP", cmd_metrics)
    sub.add_argument("--port", type=port_number, default=9191, help="the port to listen on (default 9191)")
    sub.add_argument("--host", default="127.0.0.1", help="the address to listen on (default 127.0.0.1; 0.0.0.0: all)")

    sub = command(
        "acl-rule",
        "print the least-privilege ACL rule for the broker's user, rendered for the connected server's version",
        cmd_acl_rule,
    )
    sub.add_argument(
        "--server-version",
        metavar="X.Y[.Z]",
        help="render for this server version without connecting (e.g. 7.0; Valkey numbers from 7.2)",
    )
    sub.add_argument("--wait-for-replicas", action="store_true", help="add +wait (a broker with wait_for_replicas)")
    sub.add_argument("--user", default="<user>", help="the user name to put in the ACL SETUSER command")

    sub = command("dashboard", "serve the web dashboard (queues, scheduled messages, dead letters)", cmd_dashboard)
    sub.add_argument("--port", type=port_number, default=8190, help="the port to listen on (default 8190)")
    sub.add_argument("--host", default="127.0.0.1", help="the address to listen on (default 127.0.0.1; 0.0.0.0: all)")
    sub.add_argument("--prefix", default="/", help="the URL path to serve under (default /)")
    sub.add_argument("--read-only", action="store_true", help="show everything, change nothing")
    sub.add_argument("--user", help="require HTTP basic authentication as this user (with --password-env)")
    sub.add_argument("--password-env", metavar="VAR", help="the environment variable holding the password of --user")
    return parser


def run(argv: list[str]) -> int:
    path, rest = split_broker_path(argv)
    if path is not None and ":" not in path and not any(arg in COMMANDS for arg in rest) and "-h" not in rest:
        if "--help" not in rest and "--version" not in rest:
            raise UsageError(f"unknown command {path!r} (commands: {', '.join(COMMANDS)})")
    args = build_parser().parse_args(rest)
    plain = args.plain or os.environ.get(PLAIN_ENV, "") not in ("", "0")
    out = Output(json_mode=getattr(args, "json", False), plain=plain)
    if args.command == "acl-rule" and args.server_version is not None:
        if path is not None or args.url is not None:
            raise UsageError("acl-rule: give --server-version or a broker (path, --url), not both")
        return offline_acl_rule(args, out)
    broker = connect(path, args)
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
