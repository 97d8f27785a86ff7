"""What the dashboard's handlers get and give: a request, a non-HTML body, a redirect,
an error page (shared by :mod:`._app` and the page modules)."""

from __future__ import annotations

import urllib.parse
from collections.abc import Iterable
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any

#: Auto-refresh intervals (seconds) offered on the overview and the Running page.
REFRESH_CHOICES = (0, 2, 5, 15, 60)


class HTTPError(Exception):
    """Ends a request with an error page of ``status``."""

    def __init__(self, status: HTTPStatus, detail: str, headers: Iterable[tuple[str, str]] = ()) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail
        self.headers = list(headers)


@dataclass(frozen=True)
class Body:
    """A handler's answer that is not an HTML page (a static file, JSON)."""

    content_type: str
    data: bytes


class Redirect(Exception):
    """Ends a request with a 303 to ``location``."""

    def __init__(self, location: str) -> None:
        super().__init__(location)
        self.location = location


@dataclass
class Request:
    """What a handler needs of one WSGI request."""

    method: str
    path: str  # below the dashboard's root, starting with "/"
    base: str  # the dashboard's root URL path, ending with "/"
    query: dict[str, list[str]]
    form: dict[str, list[str]]
    cookies: dict[str, str]
    environ: dict[str, Any]
    set_cookies: list[str] = field(default_factory=list)

    def arg(self, name: str, default: str = "") -> str:
        values = self.query.get(name)
        return values[0].strip() if values else default

    def field(self, name: str, default: str = "") -> str:
        values = self.form.get(name)
        return values[0].strip() if values else default

    def fields(self, name: str) -> list[str]:
        return [value for value in self.form.get(name, []) if value]

    def next_page(self, default: str) -> str:
        """The form's ``next`` page when it is a page of this dashboard (no other site,
        no scheme-relative or backslashed path: no open redirect), else ``default``."""
        target = self.field("next")
        if not target.startswith(self.base) or target.startswith("//") or "\\" in target:
            return default
        return target

    def url(self, path: str, **params: Any) -> str:
        """A URL of the dashboard: ``path`` below its root, with query ``params`` (those
        that are None or "" are left out)."""
        url = self.base + path.lstrip("/")
        query = {k: v for k, v in params.items() if v is not None and v != ""}
        return url + ("?" + urllib.parse.urlencode(query) if query else "")


def refresh_arg(request: Request) -> int:
    """The page's auto-refresh interval (``?refresh=``, seconds; 0: off).

    Raises:
      HTTPError: 400, not one of :data:`REFRESH_CHOICES`.
    """
    refresh = request.arg("refresh", "0")
    if not (refresh.isascii() and refresh.isdigit()) or int(refresh) not in REFRESH_CHOICES:
        raise HTTPError(HTTPStatus.BAD_REQUEST, f"refresh must be one of {REFRESH_CHOICES} (seconds).")
    return int(refresh)
