"""``server``: an embedded Valkey in the foreground for development (see
:func:`..embedded.serve`); the one command that needs no broker."""

from __future__ import annotations

import argparse

from ..embedded import SERVER_HELP, ServerError, add_server_arguments, serve
from ._base import Command, UsageError


def run_server(path: str | None, args: argparse.Namespace) -> int:
    """Run the dev server until Ctrl-C, SIGTERM or its terminal closes (SIGHUP), then exit
    0; a taken port, a ``--dir`` that is a file, a server that does not start or no server
    installed is a usage error (exit 2)."""
    if path is not None or args.url is not None or args.namespace is not None or args.cluster:
        raise UsageError(
            "server starts a server of its own: give no broker import path, --url, --namespace or --cluster"
        )
    try:
        return serve(host=args.host, port=args.port, data_dir=args.data_dir, json_mode=getattr(args, "json", False))
    except ServerError as e:
        raise UsageError(str(e)) from None


#: Run before any broker is connected (see :func:`run_server`): it has no handler of a
#: :class:`~._base.Context`.
SERVER = Command("server", SERVER_HELP, None, add_server_arguments)
