"""A web dashboard of a :class:`~dramatiq_redisson.RedissonBroker`'s queues: counts,
scheduled messages (paged, searchable, cancel / run now / reschedule, one or in bulk),
dead letters (with the traceback of their last failure; requeue, delete), pausing and
resuming a queue, the messages running now, and each queue's activity (processed,
retried and failed per minute and per hour, as server-drawn SVG charts).

It is a framework-free WSGI application: mount :func:`make_app`'s result in any WSGI
server or web framework, or run ``dramatiq-redisson dashboard`` (:func:`serve`). Needs
Jinja2 (the ``dashboard`` extra). Pages work without JavaScript;
nothing is loaded from outside the application.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dramatiq.logging import get_logger

from .._broker import RedissonBroker
from .._wsgi import serve_wsgi
from ._app import PAGE_SIZE, PAGE_SIZES, Dashboard

__all__ = ["PAGE_SIZE", "PAGE_SIZES", "Dashboard", "make_app", "serve"]


def make_app(
    broker: RedissonBroker,
    *,
    prefix: str = "/",
    read_only: bool = False,
    auth: tuple[str, str] | None = None,
    secret: bytes | None = None,
    page_size: int = PAGE_SIZE,
) -> Dashboard:
    """The dashboard of ``broker``'s namespace as a WSGI application.

    Parameters:
      prefix: The URL path it answers under when the server passes full paths (e.g.
        ``"/dramatiq"``); under a framework that strips its mount point into
        ``SCRIPT_NAME`` (Django, Flask's ``DispatcherMiddleware``) leave it ``"/"``.
      read_only: Show everything, change nothing: no action buttons, every POST 403.
      auth: ``(user, password)`` for HTTP basic authentication of every request
        (serve it over HTTPS, or on loopback only, as basic auth sends the password
        in the clear).
      secret: The key that signs the forms' CSRF tokens; random per process when not
        given (give every process of a multi-process server the same one).
      page_size: Scheduled messages and dead letters per page by default: 25, 50 or 100.

    Every action is a POST carrying a CSRF token (a GET never changes anything), bulk
    actions and pausing or resuming a queue ask for a confirmation first, and every
    value read from Redis is HTML-escaped.

    Raises:
      ImportError: Jinja2 is not installed.
      TypeError, ValueError: A broker that is not a RedissonBroker, or a bad option.
    """
    return Dashboard(broker, prefix=prefix, read_only=read_only, auth=auth, secret=secret, page_size=page_size)


def serve(
    broker: RedissonBroker,
    host: str = "127.0.0.1",
    port: int = 8190,
    *,
    ready: Callable[[str], None] | None = None,
    **options: Any,
) -> None:
    """Serve :func:`make_app` (``options`` are its keyword arguments) from the standard
    library's threading WSGI server on ``host``:``port`` until KeyboardInterrupt;
    ``ready`` is called with the dashboard's URL once the port is bound. Then the server
    is PINGed: one that does not answer is said once, naming it, as its pages say
    meanwhile, and once more when a page reads it again.

    Raises:
      ImportError: Jinja2 is not installed.
      TypeError, ValueError: A bad option (before anything is bound).
      OSError: The address cannot be bound.
    """
    app = make_app(broker, **options)

    def bound(url: str) -> None:
        if ready is not None:
            ready(url)
        app.reachability.check()

    try:
        serve_wsgi(app, host, port, logger=get_logger(__name__), path=app.prefix, ready=bound)
    except KeyboardInterrupt:
        pass
