"""What a dashboard page is given: the :class:`Pages` the app (``_app.Dashboard``) is to
the page modules (``_limits_page``, ``_live_pages``, ``_schedule_pages``). The pages
import this, not the app, so the app imports its pages and nothing imports it back."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from .._broker import RedissonBroker
    from ._http import Redirect, Request


class Pages(Protocol):
    """The app as its pages see it: the broker they read and act on, and the app's
    rendering, redirect and lookup helpers."""

    @property
    def broker(self) -> RedissonBroker:
        """The broker the dashboard shows."""
        ...

    def render(self, request: Request, template: str, **context: Any) -> str:
        """``template`` rendered with ``context`` and the app's common values."""
        ...

    def back(self, request: Request, default: str, flash: str) -> Redirect:
        """A redirect to the form's ``next`` page (or ``default``), telling ``flash``."""
        ...

    def known_queue(self, name: str) -> str:
        """``name`` if it is a known queue, else a 404."""
        ...

    def now_ms(self) -> int:
        """The server's clock, in milliseconds."""
        ...
