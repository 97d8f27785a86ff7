"""A browser stand-in for WSGI apps (the dashboard): calls the app in this process and
keeps its cookies."""

from __future__ import annotations

import html
import io
import re
import urllib.parse
import wsgiref.util
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Response:
    status: int
    headers: dict[str, str]
    text: str

    def location(self) -> tuple[str, dict[str, str]]:
        parts = urllib.parse.urlsplit(self.headers["Location"])
        return parts.path, dict(urllib.parse.parse_qsl(parts.query))

    def flash(self) -> str:
        found = re.search(r'<p class="flash"[^>]*>(.*?)</p>', self.text, re.S)
        return html.unescape(found.group(1)) if found else ""


@dataclass
class Client:
    """A browser stand-in: calls the WSGI app directly and keeps its cookies."""

    app: Any
    script_name: str = ""
    cookies: dict[str, str] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)
    cookies_set: list[str] = field(default_factory=list)

    def request(self, method: str, path: str, form: dict[str, Any] | None = None, **headers: str) -> Response:
        path, _, query = path.partition("?")
        body = urllib.parse.urlencode(form or {}, doseq=True).encode()
        environ: dict[str, Any] = {}
        wsgiref.util.setup_testing_defaults(environ)
        environ.update(
            REQUEST_METHOD=method,
            SCRIPT_NAME=self.script_name,
            PATH_INFO=urllib.parse.unquote(path),
            QUERY_STRING=query,
            CONTENT_LENGTH=str(len(body)),
            CONTENT_TYPE="application/x-www-form-urlencoded",
            HTTP_COOKIE="; ".join(f"{k}={v}" for k, v in self.cookies.items()),
        )
        environ["wsgi.input"] = io.BytesIO(body)
        for name, value in {**self.headers, **headers}.items():
            environ["HTTP_" + name.upper().replace("-", "_")] = value
        got: dict[str, Any] = {}

        def start_response(status: str, response_headers: list[tuple[str, str]]) -> None:
            got["status"] = int(status.split()[0])
            got["headers"] = response_headers

        data = b"".join(self.app(environ, start_response))
        for name, value in got["headers"]:
            if name == "Set-Cookie":
                self.cookies_set.append(value)
                cookie_name, _, rest = value.partition("=")
                self.cookies[cookie_name] = rest.split(";")[0]
        return Response(got["status"], dict(got["headers"]), data.decode())

    def get(self, path: str, **headers: str) -> Response:
        return self.request("GET", path, **headers)

    def post(self, path: str, form: dict[str, Any] | None = None, **headers: str) -> Response:
        return self.request("POST", path, form, **headers)

    def token(self, page: str = "/queues/default") -> str:
        """The CSRF token of a page's forms (loading it sets the cookie)."""
        found = re.search(r'name="csrf" value="([0-9a-f]+)"', self.get(page).text)
        assert found, f"no CSRF field on {page}"
        return found.group(1)
