"""The dashboard's WSGI application, without a browser: every route, its status codes,
CSRF and read-only refusals, authentication, mounting under a prefix, escaping, and the
paging API under it (DelayedQueue.page, DeadLetters.page), on the real server."""

from __future__ import annotations

import base64
import html
import io
import re
import wsgiref.util
from typing import Any

import dramatiq
import pytest
import redis
from dramatiq import Actor, Worker

from dramatiq_redisson import RedissonBroker
from dramatiq_redisson.admin import _delayed_queue as delayed_queue_module
from dramatiq_redisson.dashboard import make_app
from tests.helpers import record, records, wait_for
from tests.wsgi_client import Client, Response


@pytest.fixture
def client(broker: RedissonBroker) -> Client:
    return Client(make_app(broker))


def _ids(page: Response) -> list[str]:
    """Message ids of a page's rows, in order."""
    return re.findall(r'<tr data-id="([^"]+)"', page.text)


def _schedule(actor: Actor[..., None], count: int, delay: int = 60_000, **kwargs: Any) -> list[str]:
    return [actor.send_with_options(args=(i,), kwargs=kwargs, delay=delay + i).message_id for i in range(count)]


# -- pages -------------------------------------------------------------------------------


def test_overview_shows_the_servers_counts(
    broker: RedissonBroker, client: Client, actors: tuple[Actor[..., None], Actor[..., None]]
) -> None:
    alpha, _ = actors
    # Given 3 scheduled and 2 ready messages
    _schedule(alpha, 3)
    alpha.send(1)
    alpha.send(2)
    # When the overview is opened
    page = client.get("/")
    # Then it shows the queue with those counts, and security headers
    assert page.status == 200
    row = re.search(r'<tr data-queue="default">(.*?)</tr>', page.text, re.S)
    assert row, page.text
    cells = dict(re.findall(r'data-field="(\w+)">(.*?)</td>', row.group(1), re.S))
    assert re.sub(r"<[^>]+>", "", cells["scheduled"]).strip() == "3"
    assert cells["ready"].strip() == "2"
    assert "default-src 'none'" in page.headers["Content-Security-Policy"]
    assert page.headers["Cache-Control"] == "no-store"
    assert page.headers["X-Content-Type-Options"] == "nosniff"
    # And with an auto-refresh, a meta refresh; a bad interval is a 400
    assert '<meta http-equiv="refresh" content="5">' in client.get("/?refresh=5").text
    assert client.get("/?refresh=7").status == 400


def test_the_json_api_and_static_files(broker: RedissonBroker, client: Client, actors: Any) -> None:
    _schedule(actors[0], 2)
    api = client.get("/api/stats")
    assert api.status == 200 and api.headers["Content-Type"] == "application/json"
    assert '"scheduled": 2' in api.text
    css = client.get("/static/style.css")
    assert css.status == 200 and css.headers["Content-Type"].startswith("text/css") and "body" in css.text
    assert css.headers["Cache-Control"] == "max-age=3600"
    assert client.get("/static/app.js").headers["Content-Type"].startswith("text/javascript")
    head = client.request("HEAD", "/static/style.css")
    assert head.status == 200 and head.text == "" and head.headers["Content-Length"] == str(len(css.text.encode()))
    for missing in ("/static/nope.css", "/static/..%2f_app.py", "/static/_app.py", "/static/.hidden.css"):
        assert client.get(missing).status == 404, missing


def test_a_queue_pages_through_its_scheduled_messages_in_due_order(
    broker: RedissonBroker, client: Client, actors: tuple[Actor[..., None], Actor[..., None]]
) -> None:
    alpha, _ = actors
    # Given 60 scheduled messages
    sent = _schedule(alpha, 60)
    # When their queue is paged through, 25 at a time
    seen: list[str] = []
    path: str | None = "/queues/default"
    pages = 0
    while path is not None:
        page = client.get(path)
        assert page.status == 200
        seen += _ids(page)
        pages += 1
        found = re.search(r'href="([^"]+)" id="next-page"', page.text)
        path = html.unescape(found.group(1)) if found else None
        assert pages <= 4
    # Then every message shows once, in due order
    assert seen == sent
    assert pages == 3
    # And 50 a page is two pages; an unknown page size is a 400
    assert len(_ids(client.get("/queues/default?n=50"))) == 50
    assert client.get("/queues/default?n=7").status == 400
    assert client.get("/queues/default?after=not-a-cursor").status == 400


def test_search_by_actor_and_by_text(
    broker: RedissonBroker, client: Client, actors: tuple[Actor[..., None], Actor[..., None]]
) -> None:
    alpha, beta = actors
    a = _schedule(alpha, 5, tag="red")
    b = _schedule(beta, 5, tag="blue")
    assert _ids(client.get("/queues/default?actor=beta")) == b
    assert _ids(client.get("/queues/default?q=red")) == a
    assert _ids(client.get("/queues/default?actor=alpha&q=blue")) == []
    # Text is found as the page shows it, though the encoder escaped it
    city = alpha.send_with_options(args=(99,), kwargs={"tag": 'Zürich "hq"'}, delay=60_000).message_id
    assert _ids(client.get("/queues/default?q=Z%C3%BCrich")) == [city]
    assert _ids(client.get("/queues/default?q=%22hq%22")) == [city]
    assert broker.delayed_queue("default").remove_all(match='rich "hq') == 1
    assert "Nothing matches." in client.get("/queues/default?actor=alpha&q=blue").text


def test_a_rare_match_is_searched_within_a_budget_per_page(
    broker: RedissonBroker, client: Client, actors: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    alpha, beta = actors
    monkeypatch.setattr(delayed_queue_module, "SEARCH_BUDGET", 20)
    monkeypatch.setattr(delayed_queue_module, "SCAN_BATCH", 10)
    # Given one beta message behind 50 alpha ones
    _schedule(alpha, 50)
    (wanted,) = _schedule(beta, 1, delay=120_000)
    # When beta is searched for, the first page comes back empty with a way to go on
    page = client.get("/queues/default?actor=beta")
    assert _ids(page) == []
    assert "No match among the 20 entries searched so far." in page.text
    # And following it finds the message
    for _ in range(5):
        found = re.search(r'href="([^"]+)" id="next-page"', page.text)
        if not found:
            break
        page = client.get(html.unescape(found.group(1)))
        if _ids(page):
            break
    assert _ids(page) == [wanted]


def test_message_detail_and_missing_things_are_404(
    broker: RedissonBroker, client: Client, actors: tuple[Actor[..., None], Actor[..., None]]
) -> None:
    alpha, _ = actors
    (message_id,) = _schedule(alpha, 1, tag="x")
    page = client.get(f"/queues/default/messages/{message_id}")
    assert page.status == 200 and message_id in page.text and "alpha" in page.text
    assert 'id="dedupe-key"' not in page.text
    keyed = alpha.send_with_options(args=(2,), delay=60_000, dedupe_key="reindex:<42>", dedupe="replace")
    page = client.get(f"/queues/default/messages/{keyed.message_id}")
    assert 'id="dedupe-key">reindex:&lt;42&gt; <span class="muted">(replace)' in page.text
    assert client.get("/queues/default/messages/no-such-id").status == 404
    assert client.get("/queues/no-such-queue").status == 404
    assert client.get("/queues/no-such-queue/dead").status == 404
    assert client.get("/nowhere").status == 404
    # A GET on an action is not allowed (and changes nothing)
    refused = client.get(f"/queues/default/messages/{message_id}/cancel")
    assert refused.status == 405 and refused.headers["Allow"] == "POST"
    assert broker.delayed_queue("default").get(message_id) is not None


def test_every_value_from_redis_is_escaped(
    broker: RedissonBroker, client: Client, actors: tuple[Actor[..., None], Actor[..., None]]
) -> None:
    alpha, _ = actors
    evil = '<script>alert(1)</script>"><img src=x onerror=alert(2)>'
    message = alpha.send_with_options(args=(1,), kwargs={"tag": evil}, delay=60_000)
    for path in ("/queues/default", f"/queues/default/messages/{message.message_id}", "/queues/default?q=%3Cscript"):
        page = client.get(path)
        assert page.status == 200
        assert "<script>alert" not in page.text and "<img src=x" not in page.text, path
        assert "&lt;script&gt;" in page.text, path
    # And the error page escapes what the visitor typed
    page = client.get("/queues/%3Cscript%3Ex")
    assert page.status == 404 and "<script>x" not in page.text


# -- actions -----------------------------------------------------------------------------


def test_cancel_run_now_and_reschedule_one_message(
    broker: RedissonBroker, client: Client, actors: tuple[Actor[..., None], Actor[..., None]]
) -> None:
    alpha, _ = actors
    first, second, third = _schedule(alpha, 3, delay=3_600_000)
    delayed = broker.delayed_queue("default")
    token = client.token("/queues/default")
    # Cancel: gone, and the redirect goes back where the form said, with a message
    done = client.post(f"/queues/default/messages/{first}/cancel", {"csrf": token, "next": "/queues/default?n=50"})
    assert done.status == 303
    path, query = done.location()
    assert path == "/queues/default" and query["n"] == "50" and "cancelled" in query["flash"]
    assert delayed.get(first) is None
    # A second cancel finds nothing, and says so
    again = client.post(f"/queues/default/messages/{first}/cancel", {"csrf": token})
    assert "no longer scheduled" in again.location()[1]["flash"]
    # Reschedule by +1 min (ms), by a duration, and at a time (UTC without a zone)
    before = delayed.get(second)
    assert before is not None
    client.post(f"/queues/default/messages/{second}/reschedule", {"csrf": token, "delay": "1m"})
    moved = delayed.get(second)
    assert moved is not None and moved[0] < before[0] - 3_000_000
    client.post(f"/queues/default/messages/{second}/reschedule", {"csrf": token, "delay": "2h"})
    moved = delayed.get(second)
    assert moved is not None and moved[0] > before[0]
    client.post(f"/queues/default/messages/{second}/reschedule", {"csrf": token, "at": "2100-01-01T00:00"})
    assert delayed.get(second) == (4102444800000, moved[1])
    for bad in ({"delay": "soon"}, {"delay": "10"}, {}, {"delay": "1m", "at": "2100-01-01T00:00"}, {"at": "tuesday"}):
        refused = client.post(f"/queues/default/messages/{second}/reschedule", {"csrf": token, **bad})
        assert refused.status == 400, bad
    assert delayed.get(second) == (4102444800000, moved[1])
    # Run now: due at once
    client.post(f"/queues/default/messages/{third}/promote", {"csrf": token})
    assert wait_for(lambda: delayed.get(third) is None or delayed.get(third)[0] <= broker.stats()["time_ms"])  # type: ignore[index]
    assert client.post(f"/queues/default/messages/{third}/explode", {"csrf": token}).status == 404


def test_run_now_executes_on_a_worker(
    broker: RedissonBroker, redis_client: redis.Redis, client: Client, actors: Any, worker: Worker
) -> None:
    alpha, _ = actors
    (message_id,) = _schedule(alpha, 1, delay=3_600_000)
    client.post(f"/queues/default/messages/{message_id}/promote", {"csrf": client.token()})
    assert wait_for(lambda: len(records(redis_client)) == 1, timeout=10)


def test_bulk_actions_ask_first_then_act(
    broker: RedissonBroker, client: Client, actors: tuple[Actor[..., None], Actor[..., None]]
) -> None:
    alpha, beta = actors
    a = _schedule(alpha, 4, delay=3_600_000)
    b = _schedule(beta, 3, delay=3_600_000, tag="needle")
    delayed = broker.delayed_queue("default")
    token = client.token("/queues/default")
    # Cancel selected: a confirmation page first, nothing changed yet
    form = {"csrf": token, "action": "cancel", "ids": a[:2], "next": "/queues/default"}
    ask = client.post("/queues/default/bulk", form)
    assert ask.status == 200 and "Cancel: the 2 selected messages of queue default?" in html.unescape(ask.text)
    assert delayed.size() == 7
    # Confirmed (the confirmation page's own form): both gone
    carried = re.findall(r'<input type="hidden" name="(\w+)" value="([^"]*)"', ask.text)
    confirmed: dict[str, Any] = {}
    for name, value in carried:
        confirmed.setdefault(name, []).append(html.unescape(value))
    done = client.post("/queues/default/bulk", confirmed)
    assert done.status == 303 and done.location()[1]["flash"] == "2 scheduled messages cancelled."
    assert delayed.size() == 5 and delayed.get(a[0]) is None
    # Run all matching a text search now: the button names the action in its formaction,
    # and the confirmation page carries it on
    ask = client.post("/queues/default/bulk?action=promote", {"csrf": token, "scope": "matching", "q": "needle"})
    assert "Run now: every scheduled message containing 'needle' of queue default?" in html.unescape(ask.text)
    assert ">Yes, run now</button>" in ask.text
    confirmed = {}
    for name, value in re.findall(r'<input type="hidden" name="(\w+)" value="([^"]*)"', ask.text):
        confirmed.setdefault(name, []).append(html.unescape(value))
    done = client.post("/queues/default/bulk", confirmed)
    assert done.location()[1]["flash"] == "3 scheduled messages set to run now."
    now = broker.stats()["time_ms"]
    assert all(delayed.get(i)[0] <= now for i in b)  # type: ignore[index]
    assert delayed.count(due_before=now + 1) == 3 and delayed.size() == 5
    # Cancel everything matching an actor
    form = {"csrf": token, "action": "cancel", "scope": "matching", "actor": "alpha", "confirmed": "yes"}
    assert client.post("/queues/default/bulk", form).location()[1]["flash"] == "2 scheduled messages cancelled."
    assert delayed.size() == 3 and all(delayed.get(i) for i in b)
    # Nothing selected, and bad forms
    assert (
        "Nothing selected"
        in client.post("/queues/default/bulk", {"csrf": token, "action": "cancel"}).location()[1]["flash"]
    )
    assert client.post("/queues/default/bulk", {"csrf": token, "action": "explode"}).status == 400
    assert client.post("/queues/default/bulk", {"csrf": token, "action": "cancel", "scope": "x"}).status == 400


def test_dead_letters_page_detail_requeue_and_delete(
    broker: RedissonBroker, redis_client: redis.Redis, client: Client, worker: Worker
) -> None:
    @dramatiq.actor(max_retries=0)
    def fragile(i: int) -> None:
        record(redis_client, i=i)
        if not redis_client.exists("test:heal"):
            raise RuntimeError(f"broken {i}")

    for i in range(30):
        fragile.send(i)
    dead = broker.dead_letters("default")
    assert wait_for(lambda: dead.size() == 30, timeout=10)
    # Newest first, 25 a page, with the error of each
    first = client.get("/queues/default/dead")
    assert first.status == 200 and "(30)" in first.text
    newest = [m.options["redis_message_id"] for _, m in reversed(dead.read_all())]
    assert _ids(first) == newest[:25]
    assert _ids(client.get("/queues/default/dead?page=2")) == newest[25:]
    assert _ids(client.get("/queues/default/dead?page=3")) == []
    assert client.get("/queues/default/dead?page=0").status == 400
    assert "RuntimeError: broken" in first.text
    # The detail shows the traceback
    rid = newest[0]
    detail = client.get(f"/queues/default/dead/{rid}")
    assert detail.status == 200 and 'id="traceback"' in detail.text and "raise RuntimeError" in detail.text
    assert client.get("/queues/default/dead/nope").status == 404
    # Requeue one: it runs again (and succeeds)
    redis_client.set("test:heal", 1)
    token = client.token("/queues/default/dead")
    done = client.post(f"/queues/default/dead/{rid}/requeue", {"csrf": token})
    assert "put back on the ready queue" in done.location()[1]["flash"]
    assert wait_for(lambda: len(records(redis_client)) == 31, timeout=10)
    assert "nothing done" in client.post(f"/queues/default/dead/{rid}/requeue", {"csrf": token}).location()[1]["flash"]
    # Delete one, then delete two selected, then requeue all (confirmed)
    client.post(f"/queues/default/dead/{newest[1]}/delete", {"csrf": token})
    assert dead.get(newest[1]) is None
    form = {"csrf": token, "action": "delete", "ids": newest[2:4], "confirmed": "yes"}
    assert client.post("/queues/default/dead-bulk", form).location()[1]["flash"] == "2 dead letters deleted."
    ask = client.post("/queues/default/dead-bulk", {"csrf": token, "action": "requeue", "scope": "all"})
    assert "Requeue: all 26 dead letters of queue default?" in html.unescape(ask.text)
    form = {"csrf": token, "action": "requeue", "scope": "all", "confirmed": "yes"}
    assert client.post("/queues/default/dead-bulk", form).location()[1]["flash"] == "26 dead letters requeued."
    assert wait_for(lambda: len(records(redis_client)) == 57, timeout=10)
    assert client.post("/queues/default/dead-bulk", {"csrf": token, "action": "x"}).status == 400


# -- refusals ----------------------------------------------------------------------------


def test_posts_without_a_valid_csrf_token_change_nothing(
    broker: RedissonBroker, client: Client, actors: tuple[Actor[..., None], Actor[..., None]]
) -> None:
    (message_id,) = _schedule(actors[0], 1)
    token = client.token()
    path = f"/queues/default/messages/{message_id}/cancel"
    # No token, a wrong token, the token without its cookie, another browser's cookie
    assert client.post(path, {}).status == 403
    assert client.post(path, {"csrf": "0" * 64}).status == 403
    assert Client(client.app).post(path, {"csrf": token}).status == 403
    other = Client(client.app)
    other.token()
    assert other.post(path, {"csrf": token}).status == 403
    # A right token posted from another site
    assert client.post(path, {"csrf": token}, Origin="https://evil.example").status == 403
    # A token signed by another dashboard's secret
    assert Client(make_app(broker), cookies=dict(client.cookies)).post(path, {"csrf": token}).status == 403
    assert broker.delayed_queue("default").get(message_id) is not None
    # And the genuine form works
    assert client.post(path, {"csrf": token}, Origin="http://127.0.0.1").status == 303
    # The cookie is HttpOnly and SameSite=Strict
    fresh = Client(client.app)
    cookie = fresh.get("/").headers["Set-Cookie"]
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Path=/" in cookie


def test_the_next_page_after_an_action_stays_on_the_dashboard(
    broker: RedissonBroker, client: Client, actors: tuple[Actor[..., None], Actor[..., None]]
) -> None:
    (message_id,) = _schedule(actors[0], 1)
    token = client.token()
    for target in ("https://evil.example/", "//evil.example/queues", "/\\evil.example"):
        done = client.post(f"/queues/default/messages/{message_id}/promote", {"csrf": token, "next": target})
        assert done.location()[0] == "/queues/default", target


def test_read_only_shows_no_actions_and_refuses_posts(
    broker: RedissonBroker, actors: tuple[Actor[..., None], Actor[..., None]]
) -> None:
    (message_id,) = _schedule(actors[0], 1)
    client = Client(make_app(broker, read_only=True))
    page = client.get("/queues/default")
    assert page.status == 200 and message_id in page.text
    assert 'method="post"' in page.text  # the (empty) selection form
    assert "data-action" not in page.text and "bulk-cancel" not in page.text and 'name="csrf" value=""' in page.text
    assert 'id="cancel"' not in client.get(f"/queues/default/messages/{message_id}").text
    refused = client.post(f"/queues/default/messages/{message_id}/cancel", {"csrf": "x"})
    assert refused.status == 403 and "read-only" in refused.text
    assert broker.delayed_queue("default").get(message_id) is not None


def test_basic_auth_guards_every_page(broker: RedissonBroker) -> None:
    client = Client(make_app(broker, auth=("ops", "s3cret:with colon")))
    for path in ("/", "/static/style.css", "/api/stats", "/queues/default"):
        refused = client.get(path)
        assert refused.status == 401, path
        assert refused.headers["WWW-Authenticate"].startswith("Basic ")

    def basic(user: str, password: str) -> str:
        return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()

    assert client.get("/", Authorization=basic("ops", "wrong")).status == 401
    assert client.get("/", Authorization=basic("other", "s3cret:with colon")).status == 401
    assert client.get("/", Authorization="Basic !!!").status == 401
    assert client.get("/", Authorization="Bearer x").status == 401
    assert client.get("/", Authorization=basic("ops", "s3cret:with colon")).status == 200


def test_mounted_under_a_prefix_or_a_script_name(
    broker: RedissonBroker, actors: tuple[Actor[..., None], Actor[..., None]]
) -> None:
    (message_id,) = _schedule(actors[0], 1)
    # Under a prefix the server passes in full
    client = Client(make_app(broker, prefix="/ops/dramatiq"))
    page = client.get("/ops/dramatiq/queues/default")
    assert page.status == 200 and 'href="/ops/dramatiq/static/style.css"' in page.text
    assert client.get("/queues/default").status == 404
    assert client.get("/ops/dramatiqx").status == 404
    fresh = Client(client.app)
    assert fresh.get("/ops/dramatiq").status == 200
    assert "Path=/ops/dramatiq/" in fresh.cookies_set[0]
    # Under a framework that moved its mount point into SCRIPT_NAME
    mounted = Client(make_app(broker), script_name="/admin/queues")
    page = mounted.get("/queues/default")
    assert page.status == 200 and 'href="/admin/queues/static/style.css"' in page.text
    token = mounted.token()
    done = mounted.post(f"/queues/default/messages/{message_id}/cancel", {"csrf": token})
    assert done.location()[0] == "/admin/queues/queues/default"


def test_options_are_checked(broker: RedissonBroker) -> None:
    with pytest.raises(ValueError, match="prefix"):
        make_app(broker, prefix="ops")
    with pytest.raises(ValueError, match="page_size"):
        make_app(broker, page_size=10)
    with pytest.raises(ValueError, match="auth"):
        make_app(broker, auth=("ops", ""))
    with pytest.raises(TypeError, match="RedissonBroker"):
        make_app(object())  # type: ignore[arg-type]


def test_a_form_too_large_or_not_utf8_is_refused(broker: RedissonBroker, client: Client, actors: Any) -> None:
    token = client.token()
    big = client.post("/queues/default/bulk", {"csrf": token, "ids": ["x" * 1000] * 1100})
    assert big.status == 413
    environ: dict[str, Any] = {}
    wsgiref.util.setup_testing_defaults(environ)
    environ.update(REQUEST_METHOD="POST", PATH_INFO="/queues/default/bulk", CONTENT_LENGTH="2")
    environ["wsgi.input"] = io.BytesIO(b"\xff\xfe")
    statuses: list[str] = []
    client.app(environ, lambda status, headers: statuses.append(status))
    assert statuses == ["400 Bad Request"]


def test_redis_unreachable_is_a_503_page(redis_url: str) -> None:
    broker = RedissonBroker(url="redis://127.0.0.1:1/0", socket_connect_timeout=0.5)
    try:
        page = Client(make_app(broker)).get("/")
        assert page.status == 503 and "Cannot reach redis://127.0.0.1:1/0: " in page.text
    finally:
        broker.client.connection_pool.disconnect()


# -- the paging API under the pages ------------------------------------------------------


def test_page_cursor_survives_moves_and_ends(broker: RedissonBroker, actors: Any) -> None:
    alpha, _ = actors
    ids = _schedule(alpha, 10)
    delayed = broker.delayed_queue("default")
    first = delayed.page(size=4)
    assert [m.message_id for _, m in first.entries] == ids[:4] and first.cursor
    # The page's last entry is cancelled: the next page still starts right after it
    delayed.remove(ids[3])
    second = delayed.page(after=first.cursor, size=4)
    assert [m.message_id for _, m in second.entries] == ids[4:8]
    last = delayed.page(after=second.cursor, size=4)
    assert [m.message_id for _, m in last.entries] == ids[8:] and last.cursor is None
    # Exactly a page left: the cursor says there may be more, the next page is empty
    exact = delayed.page(after=first.cursor, size=6)
    assert len(exact.entries) == 6 and exact.cursor is not None
    assert delayed.page(after=exact.cursor, size=6) == delayed_queue_module.ScheduledPage([], None, 0)
    for bad in ("", None):
        assert delayed.page(after=bad, size=2).entries[0][1].message_id == ids[0]
    for cursor in ("!!", "bm9waXBl", "MTIzfHNob3J0"):
        with pytest.raises(ValueError, match="cursor"):
            delayed.page(after=cursor)
    with pytest.raises(ValueError):
        delayed.page(size=0)


def test_dead_letters_page_newest_first(broker: RedissonBroker, redis_client: redis.Redis) -> None:
    broker.declare_queue("default")  # (a queue must be known to be operated)
    keys = broker.keys("default")
    for i in range(7):
        redis_client.zadd(keys.xq, {f"id{i}": 1000 + i})
        redis_client.hset(keys.xq_msgs, f"id{i}", dramatiq.Message("default", "a", (i,), {}, {}).encode())
    dead = broker.dead_letters("default")
    assert [m.args[0] for _, m in dead.page(0, 3)] == [6, 5, 4]
    assert [m.args[0] for _, m in dead.page(6, 3)] == [0]
    assert dead.page(7, 3) == []
    with pytest.raises(ValueError):
        dead.page(-1)
