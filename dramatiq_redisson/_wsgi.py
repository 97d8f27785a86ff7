"""Serving a WSGI application from the standard library, for the metrics endpoint and
the dashboard (``dramatiq-redisson metrics`` / ``dashboard``), and what those servers say
while the Redis server they read is away (:class:`Reachability`)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from ._logs import CONNECTION_ERRORS, reason
from .connection._client import server_address


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


class Reachability:
    """What a server of pages (the metrics endpoint, the dashboard) says about the Redis
    server its pages read: one line when a read first fails (*Cannot reach
    redis://host:port/db: …*, or *Lost the connection to …* when reads had worked, each
    followed by ``meanwhile``, what its pages do until the server answers), nothing for
    the reads that fail after it, and one line when a read works again.

    A worker's :class:`._logs.Outage` also writes reminders while the server stays away;
    this writes none, since every page asked for during the outage says so itself. All
    its lines are warnings, so that the end of an outage shows wherever its start did
    (``dramatiq-redisson`` shows warnings only). :meth:`failed` and :meth:`reached` are
    safe from any thread.
    """

    def __init__(self, client: Any, logger: logging.Logger, meanwhile: str) -> None:
        self.address = server_address(client)
        self.client = client
        self.logger = logger
        self.meanwhile = meanwhile
        self.lock = threading.Lock()
        #: Whether a read of this server ever worked.
        self.reached_once = False
        #: When (monotonic s) the server went away; ``None`` while it is there.
        self.since: float | None = None

    def describe(self, error: BaseException) -> str:
        """``error`` as one sentence naming the server: *Cannot reach redis://…: reason.*"""
        return f"Cannot reach {self.address}: {reason(error)}."

    def check(self) -> bool:
        """PING the server now (at start), saying so if it does not answer; whether it did.
        Errors other than a connection error (a refused PING, a missing permission) are
        left to the reads that meet them."""
        try:
            self.client.ping()
        except CONNECTION_ERRORS as e:
            self.failed(e)
            return False
        except Exception:
            return True
        self.reached()
        return True

    def failed(self, error: BaseException) -> None:
        """A read could not reach the server: say so if it was there until now."""
        with self.lock:
            if self.since is not None:
                return
            self.since = time.monotonic()
            if self.reached_once:
                self.logger.warning("Lost the connection to %s: %s. %s", self.address, reason(error), self.meanwhile)
            else:
                self.logger.warning("Cannot reach %s: %s. %s", self.address, reason(error), self.meanwhile)

    def reached(self) -> None:
        """A read worked: if the server had been away, say it is back."""
        if self.since is None and self.reached_once:
            return
        with self.lock:
            since, self.since = self.since, None
            again = " again" if self.reached_once else ""
            self.reached_once = True
            if since is not None:
                self.logger.warning("Reached %s%s after %.1f s.", self.address, again, time.monotonic() - since)
