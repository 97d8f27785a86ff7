"""Serving a WSGI application from the standard library, for the metrics endpoint and
the dashboard (``dramatiq-redisson metrics`` / ``dashboard``)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True
    # Ctrl-C returns at once: closing does not wait for requests still being answered
    # (their threads are daemons; a stalled client must not hold the exit).
    block_on_close = False


def serve_wsgi(
    app: Callable[..., Any],
    host: str,
    port: int,
    *,
    logger: logging.Logger | logging.LoggerAdapter[logging.Logger],
    path: str = "/",
    ready: Callable[[str], None] | None = None,
) -> None:
    """Serve ``app`` on a threading HTTP server at ``host``:``port`` (0: a free port) until
    an exception (KeyboardInterrupt, SystemExit from a signal handler) leaves
    ``serve_forever``; the socket is closed. Requests are logged at debug level.
    ``ready`` is called with the served URL once the socket is bound.

    Raises:
      OSError: The address cannot be bound.
    """

    class Handler(WSGIRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            logger.debug(format, *args)

    server = make_server(host, port, app, _Server, Handler)
    url = f"http://{host}:{server.server_port}{path}"
    logger.info("Serving on %s", url)
    if ready is not None:
        ready(url)
    try:
        server.serve_forever()
    finally:
        server.server_close()
