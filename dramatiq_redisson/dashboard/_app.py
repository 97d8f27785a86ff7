"""The dashboard's WSGI application: routing, forms, CSRF, authentication and pages."""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import hmac
import json
import math
import secrets
import time
import urllib.parse
from collections.abc import Callable, Iterable
from http import HTTPStatus
from importlib import resources
from typing import Any

import redis

from .. import _format
from .._broker import RedissonBroker
from .._errors import needs_extra
from .._logs import CONNECTION_ERRORS, logger_for
from .._wsgi import Reachability
from ..admin._dead_letters import SEARCH_LIMIT
from ..admin._delayed_queue import DelayedQueue
from . import _charts, _limits_page, _live_pages, _schedule_pages, _workflow_pages
from ._http import REFRESH_CHOICES, Body, HTTPError, Redirect, Request, refresh_arg

#: Scheduled messages and dead letters per page.
PAGE_SIZE = 25
#: Page sizes a visitor may pick (``?n=``).
PAGE_SIZES = (25, 50, 100)
#: The largest form body accepted (bytes): a bulk selection of a page is a few kB.
MAX_BODY = 1 << 20
#: Reschedule buttons: label and delay.
RESCHEDULE_PRESETS = (("+1 min", "1m"), ("+1 h", "1h"))
#: What a schedule's buttons do: its name goes in the form (``name``), not in the path (a
#: schedule may be named "." or "..", which browsers resolve away in a path).

#: What a message's state means, on its page.
_STATE_SAYS = {
    "scheduled": "waits for its due time",
    "failed": "it failed; a retry of it waits for its due time",
    "ready": "waits for a worker",
    "running": "a worker runs it",
    "done": "it was processed",
    "dead": "it failed for good: it is in the dead letters",
}

#: HTTP methods (names, not Redis commands: tests/connection/test_acl.py takes a tuple opening with "GET" for one).
_GET, _POST = "GET", "POST"

CSRF_COOKIE = "drq_csrf"
CSRF_FIELD = "csrf"

_STATIC_TYPES = {".css": "text/css; charset=utf-8", ".js": "text/javascript; charset=utf-8", ".png": "image/png"}
_SECURITY_HEADERS = [
    (
        "Content-Security-Policy",
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    ),
    ("X-Content-Type-Options", "nosniff"),
    ("Referrer-Policy", "same-origin"),
    ("X-Frame-Options", "DENY"),
]

StartResponse = Callable[..., Any]


def _parse_cookies(header: str) -> dict[str, str]:
    cookies: dict[str, str] = {}
    for part in header.split(";"):
        name, sep, value = part.strip().partition("=")
        if sep and name and name not in cookies:
            cookies[name] = value
    return cookies


class Dashboard:
    """The WSGI application :func:`make_app` returns (see its documentation)."""

    def __init__(
        self,
        broker: RedissonBroker,
        *,
        prefix: str = "/",
        read_only: bool = False,
        auth: tuple[str, str] | None = None,
        secret: bytes | None = None,
        page_size: int = PAGE_SIZE,
    ) -> None:
        try:
            import jinja2
        except ImportError:
            raise ImportError(f"the dashboard needs Jinja2: {needs_extra('dashboard')}") from None
        if not isinstance(broker, RedissonBroker):
            raise TypeError(f"the dashboard takes a RedissonBroker, not a {type(broker).__name__}")
        if not isinstance(prefix, str) or not prefix.startswith("/"):
            raise ValueError(f"prefix must be a path starting with '/', got {prefix!r}")
        if auth is not None and (len(auth) != 2 or not all(isinstance(part, str) and part for part in auth)):
            raise ValueError("auth must be a (user, password) pair of non-empty strings")
        if page_size not in PAGE_SIZES:
            raise ValueError(f"page_size must be one of {PAGE_SIZES}, got {page_size!r}")
        self.logger = logger_for(type(self))
        self.broker = broker
        #: Says once when the server is away (its pages say so too) and once when it is back.
        self.reachability = Reachability(broker.client, self.logger, "The dashboard's pages say so until it answers.")
        self.prefix = prefix.rstrip("/") + "/"
        self.read_only = read_only
        self.auth = auth
        self.page_size = page_size
        # Signs the CSRF tokens; a new one per process unless given (all processes of a
        # multi-process server must then share it).
        self.secret = secret if secret is not None else secrets.token_bytes(32)
        self.templates = jinja2.Environment(
            loader=jinja2.PackageLoader("dramatiq_redisson.dashboard", "templates"),
            autoescape=True,
            undefined=jinja2.StrictUndefined,
            trim_blocks=True,
            lstrip_blocks=True,
        )
        self.templates.filters["iso"] = lambda ms: _format.iso(ms, precise=False)
        self.templates.filters["iso_ms"] = _format.iso
        self.templates.filters["num"] = lambda n: f"{n:,}"
        self.templates.filters["span"] = _format.span
        self.templates.filters["call"] = lambda message, width=120: _format.call_text(message, width)
        self.templates.filters["error"] = _format.last_error
        self.templates.filters["part"] = _quote
        self.templates.filters["without"] = lambda mapping, *names: {k: v for k, v in mapping.items() if k not in names}
        self.templates.globals["rel"] = _format.until
        self.templates.globals["ago"] = _format.ago
        self.templates.filters["pretty"] = lambda value: json.dumps(
            value, indent=2, ensure_ascii=False, default=str, sort_keys=True
        )
        self.routes: list[tuple[str, tuple[str, ...], Callable[..., Body | str]]] = [
            (_GET, (), self.overview),
            (_GET, ("api", "stats"), self.api_stats),
            (_GET, ("static", "*"), self.static),
            (_GET, ("queues", "*"), self.queue),
            (_GET, ("queues", "*", "messages", "*"), self.message),
            (_POST, ("queues", "*", "messages", "*", "*"), self.message_action),
            (_POST, ("queues", "*", "bulk"), self.bulk),
            (_GET, ("queues", "*", "dead"), self.dead),
            (_GET, ("queues", "*", "dead", "*"), self.dead_letter),
            (_POST, ("queues", "*", "dead", "*", "*"), self.dead_action),
            (_POST, ("queues", "*", "dead-bulk"), self.dead_bulk),
            (_POST, ("queues", "*", "pause"), functools.partial(_live_pages.queue_action, self, action="pause")),
            (_POST, ("queues", "*", "resume"), functools.partial(_live_pages.queue_action, self, action="resume")),
            (_POST, ("queues", "*", "limits"), functools.partial(_limits_page.action, self)),
            (_GET, ("running",), functools.partial(_live_pages.running, self)),
            (_GET, ("limits",), functools.partial(_limits_page.page, self)),
            (_GET, ("schedules",), functools.partial(_schedule_pages.page, self)),
            (_POST, ("schedules", "*"), functools.partial(_schedule_pages.action, self)),
            (_GET, ("workflows",), functools.partial(_workflow_pages.listing, self)),
            (_GET, ("workflows", "*"), functools.partial(_workflow_pages.workflow, self)),
            (_POST, ("workflows", "*", "cancel"), functools.partial(_workflow_pages.cancel, self)),
        ]

    # -- WSGI --------------------------------------------------------------------------

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        headers: list[tuple[str, str]] = []
        request: Request | None = None
        try:
            request = self._request(environ)
            self._authenticate(environ)
            body = self._dispatch(request)
            if not request.path.startswith("/static/"):
                self.reachability.reached()
            status = HTTPStatus.OK
            if isinstance(body, Body):
                content = body.data
                headers.append(("Content-Type", body.content_type))
            else:
                content = body.encode()
                headers.append(("Content-Type", "text/html; charset=utf-8"))
        except Redirect as r:
            status, content = HTTPStatus.SEE_OTHER, b""
            headers.append(("Location", r.location))
        except HTTPError as e:
            status, content = e.status, self._error_page(request, e).encode()
            headers += [("Content-Type", "text/html; charset=utf-8"), *e.headers]
        except CONNECTION_ERRORS as e:
            # Said once per outage in the log; every page asked for meanwhile says it.
            self.reachability.failed(e)
            detail = f"{self.reachability.describe(e)} Start the server (or check the broker's URL), then reload."
            error = HTTPError(HTTPStatus.SERVICE_UNAVAILABLE, detail)
            status, content = error.status, self._error_page(request, error).encode()
            headers.append(("Content-Type", "text/html; charset=utf-8"))
        except redis.RedisError as e:
            self.logger.warning("Dashboard request failed on Redis: %s", e)
            error = HTTPError(HTTPStatus.SERVICE_UNAVAILABLE, f"Redis error: {type(e).__name__}: {_format.one_line(e)}")
            status, content = error.status, self._error_page(request, error).encode()
            headers.append(("Content-Type", "text/html; charset=utf-8"))
        cache = "max-age=3600" if request is not None and request.path.startswith("/static/") else "no-store"
        headers += [("Content-Length", str(len(content))), ("Cache-Control", cache), *_SECURITY_HEADERS]
        if request is not None:
            headers += [("Set-Cookie", cookie) for cookie in request.set_cookies]
        start_response(f"{status.value} {status.phrase}", headers)
        return [b""] if environ.get("REQUEST_METHOD", "").upper() == "HEAD" else [content]

    def _request(self, environ: dict[str, Any]) -> Request:
        script_name = environ.get("SCRIPT_NAME", "").rstrip("/")
        path = environ.get("PATH_INFO", "") or "/"
        if not (path + "/").startswith(self.prefix):
            raise HTTPError(HTTPStatus.NOT_FOUND, f"No page at {path!r}.")
        path = "/" + path[len(self.prefix) :]
        method = environ.get("REQUEST_METHOD", "GET").upper()
        form: dict[str, list[str]] = {}
        if method == "POST":
            try:
                length = int(environ.get("CONTENT_LENGTH") or 0)
            except ValueError:
                raise HTTPError(HTTPStatus.BAD_REQUEST, "Invalid Content-Length.") from None
            if length > MAX_BODY:
                raise HTTPError(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, "The form is too large.")
            raw = environ["wsgi.input"].read(length) if length > 0 else b""
            try:
                form = urllib.parse.parse_qs(raw.decode("utf-8"), strict_parsing=False)
            except UnicodeDecodeError:
                raise HTTPError(HTTPStatus.BAD_REQUEST, "The form is not UTF-8.") from None
        query = urllib.parse.parse_qs(environ.get("QUERY_STRING", ""))
        cookies = _parse_cookies(environ.get("HTTP_COOKIE", ""))
        return Request(method, path, script_name + self.prefix, query, form, cookies, environ)

    def _authenticate(self, environ: dict[str, Any]) -> None:
        if self.auth is None:
            return
        challenge = [("WWW-Authenticate", 'Basic realm="dramatiq-redisson", charset="UTF-8"')]
        scheme, _, encoded = environ.get("HTTP_AUTHORIZATION", "").partition(" ")
        if scheme.lower() == "basic":
            try:
                user, _, password = base64.b64decode(encoded, validate=True).decode("utf-8").partition(":")
            except (binascii.Error, UnicodeDecodeError):
                user, password = "", ""
            expected_user, expected_password = self.auth
            # Both compared, always: no early exit tells which one was wrong.
            same_user = hmac.compare_digest(user.encode(), expected_user.encode())
            if hmac.compare_digest(password.encode(), expected_password.encode()) & same_user:
                return
        raise HTTPError(HTTPStatus.UNAUTHORIZED, "Log in to see the dashboard.", challenge)

    def _dispatch(self, request: Request) -> Body | str:
        parts = tuple(urllib.parse.unquote(part) for part in request.path.strip("/").split("/") if part)
        allowed: list[str] = []
        for method, pattern, handler in self.routes:
            if len(pattern) == len(parts) and all(p in ("*", part) for p, part in zip(pattern, parts, strict=True)):
                if method == request.method or (method == "GET" and request.method == "HEAD"):
                    if method == "POST":
                        self._check_post(request)
                    return handler(request, *(part for p, part in zip(pattern, parts, strict=True) if p == "*"))
                allowed.append(method)
        if allowed:
            raise HTTPError(
                HTTPStatus.METHOD_NOT_ALLOWED, f"{request.method} is not allowed here.", [("Allow", ", ".join(allowed))]
            )
        raise HTTPError(HTTPStatus.NOT_FOUND, f"No page at {request.path!r}.")

    # -- CSRF --------------------------------------------------------------------------

    def _csrf_token(self, request: Request) -> str:
        """The token forms carry: the HMAC of this browser's CSRF cookie (set now if it
        has none). A forged form on another site can neither read the cookie nor the
        token, and the cookie is never sent cross-site (SameSite=Strict)."""
        nonce = request.cookies.get(CSRF_COOKIE, "")
        if len(nonce) != 32:
            nonce = secrets.token_hex(16)
            request.cookies[CSRF_COOKIE] = nonce
            request.set_cookies.append(f"{CSRF_COOKIE}={nonce}; Path={request.base}; HttpOnly; SameSite=Strict")
        return hmac.new(self.secret, nonce.encode(), hashlib.sha256).hexdigest()

    def _check_post(self, request: Request) -> None:
        if self.read_only:
            raise HTTPError(HTTPStatus.FORBIDDEN, "This dashboard is read-only: nothing can be changed from it.")
        origin = request.environ.get("HTTP_ORIGIN")
        host = request.environ.get("HTTP_HOST")
        if origin and origin != "null" and host and urllib.parse.urlsplit(origin).netloc != host:
            raise HTTPError(HTTPStatus.FORBIDDEN, "The form came from another site.")
        nonce = request.cookies.get(CSRF_COOKIE, "")
        expected = hmac.new(self.secret, nonce.encode(), hashlib.sha256).hexdigest()
        if len(nonce) != 32 or not hmac.compare_digest(request.field(CSRF_FIELD), expected):
            raise HTTPError(
                HTTPStatus.FORBIDDEN,
                "The form's security token is missing or stale (CSRF check). Reload the page and try again.",
            )

    # -- rendering ---------------------------------------------------------------------

    def render(self, request: Request, template: str, **context: Any) -> str:
        context.setdefault("title", None)
        # str(): without Jinja2's stubs (the lint env types without extras) render() is Any.
        return str(
            self.templates.get_template(template).render(
                request=request,
                url=request.url,
                csrf=self._csrf_token(request) if not self.read_only else "",
                read_only=self.read_only,
                namespace=self.broker.namespace,
                flash=request.arg("flash"),
                **context,
            )
        )

    def _error_page(self, request: Request | None, error: HTTPError) -> str:
        if request is None:
            request = Request(_GET, "/", self.prefix, {}, {}, {}, {})
        try:
            return self.render(request, "error.html", title=error.status.phrase, error=error)
        except Exception:  # never fail to fail
            self.logger.exception("Could not render the error page.")
            return f"<!doctype html><title>{error.status.value}</title><p>{error.status.phrase}</p>"

    def back(self, request: Request, default: str, flash: str) -> Redirect:
        """A redirect to the form's ``next`` page (only a page of this dashboard), or
        ``default``, telling what was done."""
        target = request.next_page(default)
        parts = urllib.parse.urlsplit(target)
        query = [(k, v) for k, v in urllib.parse.parse_qsl(parts.query) if k != "flash"] + [("flash", flash)]
        return Redirect(urllib.parse.urlunsplit(("", "", parts.path, urllib.parse.urlencode(query), "")))

    # -- lookups -----------------------------------------------------------------------

    def known_queue(self, name: str) -> str:
        """``name`` if it is a known queue, as the broker names it (the broker's one check,
        :meth:`QueueAdmin.known`; a page's address has no ``.DQ``/``.XQ`` name), else a 404."""
        try:
            known = self.broker.admin.known(name)
        except ValueError:
            known = None
        if known != name:
            raise HTTPError(HTTPStatus.NOT_FOUND, f"No queue named {name!r} in namespace {self.broker.namespace!r}.")
        return name

    def now_ms(self) -> int:
        return self.broker.admin.server_ms()

    def _page_size(self, request: Request) -> int:
        text = request.arg("n", str(self.page_size))
        if not (text.isascii() and text.isdigit()) or int(text) not in PAGE_SIZES:
            raise HTTPError(HTTPStatus.BAD_REQUEST, f"Page size must be one of {', '.join(map(str, PAGE_SIZES))}.")
        return int(text)

    # -- pages -------------------------------------------------------------------------

    def overview(self, request: Request) -> str:
        refresh = refresh_arg(request)
        started = time.perf_counter()
        stats = self.broker.stats()
        return self.render(
            request,
            "overview.html",
            stats=stats,
            now=stats["time_ms"],
            refresh=refresh,
            refresh_choices=REFRESH_CHOICES,
            totals={
                key: sum(int(queue[key]) for queue in stats["queues"].values())
                for key in ("ready", "in_flight", "scheduled", "overdue", "dead")
            },
            last_hour=_charts.totals([queue["last_hour"] for queue in stats["queues"].values()]),
            elapsed_ms=(time.perf_counter() - started) * 1000,
        )

    def api_stats(self, request: Request) -> Body:
        doc = _format.stats_doc(self.broker.stats(), self.broker.namespace)
        return Body("application/json", json.dumps(doc).encode())

    def static(self, request: Request, name: str) -> Body:
        suffix = name[name.rfind(".") :] if "." in name else ""
        if "/" in name or name.startswith(".") or suffix not in _STATIC_TYPES:
            raise HTTPError(HTTPStatus.NOT_FOUND, f"No static file {name!r}.")
        try:
            data = resources.files("dramatiq_redisson.dashboard").joinpath("static", name).read_bytes()
        except (FileNotFoundError, IsADirectoryError):
            raise HTTPError(HTTPStatus.NOT_FOUND, f"No static file {name!r}.") from None
        return Body(_STATIC_TYPES[suffix], data)

    def queue(self, request: Request, name: str) -> str:
        started = time.perf_counter()
        queue = self.known_queue(name)
        size = self._page_size(request)
        actor, text = request.arg("actor"), request.arg("q")
        delayed = self.broker.delayed_queue(queue)
        try:
            page = delayed.page(
                after=request.arg("after") or None, size=size, actor_name=actor or None, match=text or None
            )
        except ValueError as e:
            raise HTTPError(HTTPStatus.BAD_REQUEST, str(e)) from None
        stats = self.broker.stats(queue)
        page_number = request.arg("page", "1")
        return self.render(
            request,
            "queue.html",
            title=f"{queue}: scheduled",
            queue=queue,
            counts=stats["queues"][queue],
            now=stats["time_ms"],
            page=page,
            size=size,
            page_sizes=PAGE_SIZES,
            page_number=int(page_number) if (page_number.isascii() and page_number.isdigit()) else 1,
            actor=actor,
            text=text,
            filtered=bool(actor or text),
            actors=sorted(name for name in self.broker.actors if self.broker.actors[name].queue_name == queue),
            presets=RESCHEDULE_PRESETS,
            here=request.url(
                f"queues/{_quote(queue)}",
                actor=actor,
                q=text,
                after=request.arg("after"),
                n=request.arg("n"),
                page=request.arg("page"),
                hours=request.arg("hours"),
            ),
            **_live_pages.activity(self, request, queue),
            elapsed_ms=(time.perf_counter() - started) * 1000,
        )

    def message(self, request: Request, name: str, message_id: str) -> str:
        """One message of the queue, in whatever state it is (``broker.message_state``)."""
        queue = self.known_queue(name)
        state = self.broker.message_state(message_id, queue)
        if state["state"] == "unknown":
            raise HTTPError(
                HTTPStatus.NOT_FOUND,
                f"Message {message_id!r} is not on queue {queue!r}: never sent there, cancelled, expired from "
                "the dead letters, or done (done messages are kept only with the broker's done_retention).",
            )
        return self.render(
            request,
            "message.html",
            title=f"{state['actor'] or 'message'} {message_id}",
            queue=queue,
            state=state,
            says=_STATE_SAYS,
            due=state["due_ms"],
            message=state["message"],
            now=state["time_ms"],
            presets=RESCHEDULE_PRESETS,
            here=request.url(f"queues/{_quote(queue)}/messages/{_quote(message_id)}"),
        )

    def message_action(self, request: Request, name: str, message_id: str, action: str) -> str:
        queue = self.known_queue(name)
        delayed = self.broker.delayed_queue(queue)
        default = request.url(f"queues/{_quote(queue)}")
        if action == "cancel":
            done, what = delayed.remove(message_id), "cancelled"
        elif action == "promote":
            done, what = delayed.promote(message_id), "set to run now"
        elif action == "reschedule":
            delay, at = request.field("delay"), request.field("at")
            try:
                if delay and not at:
                    delay_ms = _format.parse_duration(delay)
                    done = delayed.reschedule(message_id, delay=delay_ms)
                    what = f"rescheduled to run in {_format.span(delay_ms)}"
                elif at and not delay:
                    due = _format.parse_time(at if at[-1:] in "Zz" or "+" in at[10:] or "-" in at[10:] else at + "Z")
                    done = delayed.reschedule(message_id, at=due)
                    what = f"rescheduled to {_format.iso(due, precise=False)}"
                else:
                    raise HTTPError(HTTPStatus.BAD_REQUEST, "Give a delay (e.g. 90s, 10m, 1h30m) or a time, not both.")
            except (ValueError, TypeError) as e:
                raise HTTPError(HTTPStatus.BAD_REQUEST, f"Cannot reschedule: {e}") from None
        else:
            raise HTTPError(HTTPStatus.NOT_FOUND, f"No action {action!r} on a scheduled message.")
        if not done:
            raise self.back(request, default, f"Message {message_id} is no longer scheduled: nothing done.")
        raise self.back(request, default, f"Message {message_id} {what}.")

    def _selection(self, request: Request, page: str, ids: list[str], noun: str) -> str:
        """What a bulk action on the selected rows acts on ("the 2 selected messages"), or
        a redirect back to ``page`` when nothing is selected."""
        if not ids:
            raise self.back(request, request.url(page), "Nothing selected: nothing done.")
        return f"the {len(ids)} selected {noun}{'s' if len(ids) != 1 else ''}"

    def _ask_first(
        self, request: Request, queue: str, page: str, post: str, action: str, scope: str, verb: str, description: str
    ) -> str | None:
        """The confirmation page of a bulk ``action`` on ``scope`` (posted to ``post``,
        from ``page``), or None once it is confirmed. Destructive ones get a red button."""
        if request.field("confirmed") == "yes":
            return None
        return self.render(
            request,
            "confirm.html",
            title=f"{verb}?",
            queue=queue,
            question=f"{verb}: {description} of queue {queue}?",
            action=request.url(post),
            carried=_carried(request, action, scope),
            back=request.field("next") or request.url(page),
            button=f"Yes, {verb.lower()}",
            danger=action in ("cancel", "delete"),
        )

    def bulk(self, request: Request, name: str) -> str:
        queue = self.known_queue(name)
        action = request.field("action") or request.arg("action")
        if action not in ("cancel", "promote"):
            raise HTTPError(HTTPStatus.BAD_REQUEST, "Choose to cancel or to run now.")
        scope = request.field("scope", "selected")
        delayed = self.broker.delayed_queue(queue)
        actor, text = request.field("actor"), request.field("q")
        ids = request.fields("ids")
        page = f"queues/{_quote(queue)}"
        if scope == "selected":
            description = self._selection(request, page, ids, "message")
        elif scope == "matching":
            description = _matching_description(actor, text, delayed)
        else:
            raise HTTPError(HTTPStatus.BAD_REQUEST, "scope must be 'selected' or 'matching'.")
        verb = "Cancel" if action == "cancel" else "Run now"
        asked = self._ask_first(request, queue, page, f"{page}/bulk", action, scope, verb, description)
        if asked is not None:
            return asked
        if scope == "selected":
            if action == "cancel":
                count = delayed.remove_many(ids)
            else:
                count = sum(1 for message_id in ids if delayed.promote(message_id))
        elif action == "cancel":
            count = delayed.remove_all(actor_name=actor or None, match=text or None)
        else:
            count = delayed.promote_all(actor_name=actor or None, match=text or None)
        done = "cancelled" if action == "cancel" else "set to run now"
        raise self.back(request, request.url(page), f"{_count(count, 'scheduled message')} {done}.")

    def dead(self, request: Request, name: str) -> str:
        queue = self.known_queue(name)
        size = self._page_size(request)
        page_text = request.arg("page", "1")
        if not (page_text.isascii() and page_text.isdigit()) or int(page_text) < 1:
            raise HTTPError(HTTPStatus.BAD_REQUEST, "page must be a whole number from 1.")
        page_number = int(page_text)
        dead = self.broker.dead_letters(queue)
        total = dead.size()
        # ?id=: the dead letters a message id (or a redis id) names; one opens at once.
        lookup = request.arg("id")
        if lookup:
            letters = dead.find(lookup)
            if len(letters) == 1:
                rid = str(letters[0][1].options["redis_message_id"])
                flash = request.arg("flash")
                raise Redirect(request.url(f"queues/{_quote(queue)}/dead/{_quote(rid)}", flash=flash))
        else:
            letters = dead.page((page_number - 1) * size, size)
        return self.render(
            request,
            "dead.html",
            title=f"{queue}: dead letters" + (f" of {lookup}" if lookup else ""),
            queue=queue,
            letters=letters,
            lookup=lookup,
            searched=min(total, SEARCH_LIMIT),
            total=total,
            size=size,
            page_sizes=PAGE_SIZES,
            page_number=1 if lookup else page_number,
            pages=1 if lookup else max(1, math.ceil(total / size)),
            now=self.now_ms(),
            here=request.url(f"queues/{_quote(queue)}/dead", id=lookup, page=request.arg("page"), n=request.arg("n")),
        )

    def dead_letter(self, request: Request, name: str, id: str) -> str:
        """One dead letter, by its redis id or its message id; a message id that names
        several lists them."""
        queue = self.known_queue(name)
        letters = self.broker.dead_letters(queue).find(id)
        if not letters:
            raise HTTPError(HTTPStatus.NOT_FOUND, f"No dead letter {id!r} on queue {queue!r}.")
        if len(letters) > 1:
            raise Redirect(request.url(f"queues/{_quote(queue)}/dead", id=id))
        [(died, message)] = letters
        redis_message_id = str(message.options["redis_message_id"])
        return self.render(
            request,
            "dead_letter.html",
            title=f"dead: {message.actor_name} {id}",
            queue=queue,
            died=died,
            message=message,
            redis_message_id=redis_message_id,
            now=self.now_ms(),
            here=request.url(f"queues/{_quote(queue)}/dead/{_quote(redis_message_id)}"),
        )

    def dead_action(self, request: Request, name: str, id: str, action: str) -> str:
        """Requeue or delete the dead letter ``id`` names (a redis id, or a message id):
        a message id that names several is requeued by none (each would run the message
        again: the page lists them to pick one) and deleted whole."""
        queue = self.known_queue(name)
        dead = self.broker.dead_letters(queue)
        default = request.url(f"queues/{_quote(queue)}/dead")
        if action not in ("requeue", "delete"):
            raise HTTPError(HTTPStatus.NOT_FOUND, f"No action {action!r} on a dead letter.")
        rids = [str(message.options["redis_message_id"]) for _, message in dead.find(id)]
        if action == "requeue" and len(rids) > 1:
            raise self.back(
                request,
                request.url(f"queues/{_quote(queue)}/dead", id=id),
                f"Message id {id} names {len(rids)} dead letters: requeue one of them, nothing done.",
            )
        count = dead.act("requeue" if action == "requeue" else "remove", rids)
        if not count:
            raise self.back(request, default, f"No dead letter {id}: nothing done.")
        what = "put back on the ready queue" if action == "requeue" else "deleted"
        if len(rids) > 1:
            raise self.back(request, default, f"{_count(count, 'dead letter')} of message id {id} {what}.")
        raise self.back(request, default, f"Dead letter {id} {what}.")

    def dead_bulk(self, request: Request, name: str) -> str:
        queue = self.known_queue(name)
        action = request.field("action") or request.arg("action")
        if action not in ("requeue", "delete"):
            raise HTTPError(HTTPStatus.BAD_REQUEST, "Choose to requeue or to delete.")
        scope = request.field("scope", "selected")
        dead = self.broker.dead_letters(queue)
        ids = request.fields("ids")
        page = f"queues/{_quote(queue)}/dead"
        if scope == "selected":
            description = self._selection(request, page, ids, "dead letter")
        elif scope == "all":
            description = f"all {dead.size():,} dead letters"
        else:
            raise HTTPError(HTTPStatus.BAD_REQUEST, "scope must be 'selected' or 'all'.")
        verb = "Requeue" if action == "requeue" else "Delete"
        asked = self._ask_first(request, queue, page, f"{page}-bulk", action, scope, verb, description)
        if asked is not None:
            return asked
        if scope == "selected":
            count = dead.act("requeue" if action == "requeue" else "remove", ids)
        elif action == "requeue":
            count = dead.requeue_all()
        else:
            count = dead.clear()
        done = "requeued" if action == "requeue" else "deleted"
        raise self.back(request, request.url(page), f"{_count(count, 'dead letter')} {done}.")


def _quote(part: str) -> str:
    return urllib.parse.quote(part, safe="")


def _matching_description(actor: str, text: str, delayed: DelayedQueue) -> str:
    if not actor and not text:
        return f"all {delayed.size():,} scheduled messages"
    filters = [f"of actor {actor}" if actor else "", f"containing {text!r}" if text else ""]
    return "every scheduled message " + " and ".join(f for f in filters if f)


def _carried(request: Request, action: str, scope: str) -> list[tuple[str, str]]:
    """A bulk form's fields, to post again from its confirmation page."""
    fields = [("action", action), ("scope", scope)]
    skip = (CSRF_FIELD, "confirmed", "action", "scope")
    return fields + [(k, v) for k, values in request.form.items() if k not in skip for v in values]


def _count(count: int, noun: str) -> str:
    """``1 dead letter``, ``1,200 dead letters``."""
    return f"{count:,} {noun}{'s' if count != 1 else ''}"
