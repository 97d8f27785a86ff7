"""Servers: ``metrics`` (Prometheus) and ``dashboard`` (the web dashboard)."""

from __future__ import annotations

import argparse
import errno
import importlib
import os
from collections.abc import Callable
from typing import Any

from .._errors import needs_extra
from .._format import one_line
from ._base import EXIT_OK, Command, Context, UsageError, port_number
from ._output import Output


def _cannot_serve(what: str, host: str, port: int, error: OSError) -> UsageError:
    """The usage error of an address that cannot be bound; a taken port says what to do."""
    hint = "; stop what listens there or choose another port with --port" if error.errno == errno.EADDRINUSE else ""
    return UsageError(f"cannot serve {what} on {host}:{port}: {one_line(error)}{hint}")


def _metrics_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--port", type=port_number, default=9191, help="the port to listen on (default 9191)")
    parser.add_argument(
        "--host", default="127.0.0.1", help="the address to listen on (default 127.0.0.1; 0.0.0.0: all)"
    )


def cmd_metrics(ctx: Context) -> int:
    args = ctx.args
    needs = f"the metrics command needs prometheus-client ({needs_extra('metrics')})"
    try:
        metrics = importlib.import_module("dramatiq_redisson.metrics")
        importlib.import_module("prometheus_client")
    except ImportError as e:
        raise UsageError(f"{needs}: {one_line(e)}") from None
    serve: Callable[..., Any] = metrics.serve

    # Called once the port is bound: a taken port is refused before anything says it serves.
    def ready(url: str) -> None:
        if ctx.json_mode:
            ctx.out.json({"host": args.host, "port": args.port, "url": url})
        Output.note(f"Serving Prometheus metrics of namespace {ctx.broker.namespace!r} on {url} (Ctrl-C stops)")

    try:
        serve(ctx.broker, host=args.host, port=args.port, ready=ready)
    except KeyboardInterrupt:
        pass
    except ImportError as e:
        raise UsageError(f"{needs}: {one_line(e)}") from None
    except OSError as e:
        raise _cannot_serve("metrics", args.host, args.port, e) from None
    return EXIT_OK


METRICS = Command(
    "metrics",
    "serve Prometheus metrics of the queues over HTTP",
    cmd_metrics,
    _metrics_arguments,
)


def _dashboard_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--port", type=port_number, default=8190, help="the port to listen on (default 8190)")
    parser.add_argument(
        "--host", default="127.0.0.1", help="the address to listen on (default 127.0.0.1; 0.0.0.0: all)"
    )
    parser.add_argument("--prefix", default="/", help="the URL path to serve under (default /)")
    parser.add_argument("--read-only", action="store_true", help="show everything, change nothing")
    parser.add_argument("--user", help="require HTTP basic authentication as this user (with --password-env)")
    parser.add_argument("--password-env", metavar="VAR", help="the environment variable holding the password of --user")


def cmd_dashboard(ctx: Context) -> int:
    args = ctx.args
    needs = f"the dashboard needs Jinja2 ({needs_extra('dashboard')})"
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
        importlib.import_module("jinja2")
    except ImportError as e:
        # Jinja2 missing says no more than `needs`; one that fails to import says why.
        raise UsageError(needs if e.name == "jinja2" else f"{needs}: {one_line(e)}") from None
    try:
        dashboard = importlib.import_module("dramatiq_redisson.dashboard")
        options = {"prefix": args.prefix, "read_only": args.read_only, "auth": auth}
        dashboard.serve(ctx.broker, args.host, args.port, ready=ready, **options)
    except ImportError as e:
        raise UsageError(f"cannot load the dashboard: {one_line(e)}") from None
    except OSError as e:
        raise _cannot_serve("the dashboard", args.host, args.port, e) from None
    return EXIT_OK


DASHBOARD = Command(
    "dashboard",
    "serve the web dashboard (queues, scheduled messages, dead letters)",
    cmd_dashboard,
    _dashboard_arguments,
)
