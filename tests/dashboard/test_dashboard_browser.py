"""The dashboard in a real headless Chromium (Playwright), served by the
``dramatiq-redisson dashboard`` command on a real port, against the real server: what an
operator sees and clicks, and what the server then holds."""

from __future__ import annotations

import json
import os
import re
import threading
import urllib.parse
from collections.abc import Iterator
from itertools import islice
from typing import TYPE_CHECKING, Any

import dramatiq
import pytest
import redis
from dramatiq import Worker

from dramatiq_redisson import RedissonBroker, _format
from dramatiq_redisson.workflows import chain, group
from tests.browser import launch, missing_browser, serve_dashboard
from tests.helpers import record, records, wait_for

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page

HOUR = 3_600_000
XSS_SCRIPT = "<script>window.__xss = 1</script>"
XSS_ATTRIBUTE = '"><img src=x onerror="window.__xss=2">'


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    reason = missing_browser()
    if reason:
        pytest.skip(reason)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = launch(playwright)
        yield browser
        browser.close()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    context.set_default_timeout(10_000)
    page = context.new_page()
    yield page
    context.close()


@pytest.fixture(scope="module")
def dashboard(redis_url: str) -> Iterator[str]:
    """The root URL of ``dramatiq-redisson dashboard`` serving the tests' namespace."""
    with serve_dashboard(redis_url) as url:
        yield url


def number(text: str) -> int:
    return int(text.replace(",", "").strip())


def row_ids(page: Page, table: str = "#scheduled") -> list[str]:
    return [row.get_attribute("data-id") or "" for row in page.locator(f"{table} tbody tr").all()]


def flash(page: Page) -> str:
    """The message the page shows after an action; fails on an error page, saying why."""
    page.wait_for_selector("p.flash, p.error-box")
    if page.locator("p.flash").count() == 0:
        pytest.fail(f"{page.url} shows an error: {page.locator('main').inner_text()}")
    return page.locator("p.flash").inner_text()


def search(page: Page, actor: str = "", text: str = "") -> None:
    """Search the queue page for ``actor``'s messages holding ``text``; return once the
    results page is shown."""
    page.fill("#search-actor", actor)
    page.fill("#search-text", text)
    page.locator("#search button[type=submit]").click()

    def shown(url: str) -> bool:
        query = urllib.parse.parse_qs(urllib.parse.urlsplit(url).query)
        return query.get("actor", [""])[0] == actor and query.get("q", [""])[0] == text

    page.wait_for_url(shown)


def scheduled_ids(broker: RedissonBroker, queue_name: str = "default") -> set[str]:
    return {message.message_id for _, message in broker.delayed_queue(queue_name).scan()}


# -- overview ----------------------------------------------------------------------------


def test_overview_shows_the_counts_the_server_holds(broker: RedissonBroker, page: Page, dashboard: str) -> None:
    # Given two queues: "emails" with ready and scheduled messages, "reports" with an
    # overdue backlog (no consumer), and a worker consuming a third queue, "billing"
    @dramatiq.actor(queue_name="emails")
    def send_email(user_id: int) -> None:
        pass

    @dramatiq.actor(queue_name="reports")
    def build_report(account: str) -> None:
        pass

    @dramatiq.actor(queue_name="billing")
    def charge(invoice: str) -> None:
        pass

    for i in range(3):
        send_email.send(i)
    broker.enqueue_many([send_email.message(100 + i) for i in range(1234)], delay=HOUR)
    for account in ("acme", "globex"):
        build_report.send_with_options(args=(account,), delay=1)
    charge.send_with_options(args=("INV-1",), delay=2 * HOUR)
    worker = Worker(broker, queues={"billing"}, worker_threads=1, worker_timeout=100)
    worker.start()
    try:

        def settled() -> bool:
            queues = broker.stats()["queues"]
            return queues["reports"]["overdue"] == 2 and queues["billing"]["consumers"] == 1

        assert wait_for(settled), broker.stats()
        stats = broker.stats()

        # When the overview is opened
        page.goto(dashboard)

        # Then every queue's row shows the server's counts, and the cards their totals
        assert page.title() == "dramatiq-redisson"
        shown = [row.get_attribute("data-queue") for row in page.locator("#queues tbody tr").all()]
        assert shown == sorted(stats["queues"]) == ["billing", "emails", "reports"]
        for name, counts in stats["queues"].items():
            row = page.locator(f'#queues tr[data-queue="{name}"]')
            for field in ("ready", "in_flight", "scheduled", "overdue", "dead", "consumers"):
                assert number(row.locator(f'td[data-field="{field}"]').inner_text()) == counts[field], (name, field)
            due = row.locator('td[data-field="next_due"] time').get_attribute("datetime")
            assert due == _format.iso(counts["next_due_ms"]), name
        assert stats["queues"]["emails"]["ready"] == 3 and stats["queues"]["emails"]["scheduled"] == 1234
        assert page.locator('#queues tr[data-queue="emails"] td[data-field="scheduled"]').inner_text() == "1,234"
        assert "warn" in (
            page.locator('#queues tr[data-queue="reports"] td[data-field="overdue"]').get_attribute("class") or ""
        )
        for key in ("ready", "in_flight", "scheduled", "overdue", "dead"):
            total = sum(int(counts[key]) for counts in stats["queues"].values())  # type: ignore[literal-required]
            assert number(page.locator(f"#total-{key}").inner_text()) == total, key
        assert number(page.locator("#workers").inner_text()) == stats["workers"] == 1

        # And a queue's name leads to its scheduled messages
        page.click('#queues tr[data-queue="emails"] td a')
        assert page.locator("h1").inner_text() == "emails: scheduled messages"
        assert page.locator("#count-scheduled").inner_text() == "1,234"
    finally:
        worker.stop()


# -- scheduled messages ----------------------------------------------------------------


def test_pages_through_ten_thousand_scheduled_messages_in_due_order(
    broker: RedissonBroker, page: Page, dashboard: str
) -> None:
    # Given 10,000 messages scheduled in 500 batches of 20 sharing a due time, the
    # batches' due times a second apart and out of send order
    @dramatiq.actor
    def tick(i: int) -> None:
        pass

    for batch in range(500):
        delay = HOUR + ((batch * 7919) % 500) * 1000
        broker.enqueue_many([tick.message(batch * 20 + i) for i in range(20)], delay=delay)
    head = [message.message_id for _, message in islice(broker.delayed_queue("default").scan(), 100)]

    # When the queue is opened and paged through with "Next page" three times
    page.goto(dashboard + "queues/default")
    assert page.locator("#count-scheduled").inner_text() == "10,000"
    seen: list[str] = []
    dues: list[str] = []
    for number_ in range(1, 5):
        # Then each page is the next 25 in due order, numbered, no message shown twice
        assert re.search(rf"\bPage {number_}\b", page.locator(".pager").inner_text())
        ids = row_ids(page)
        assert len(ids) == 25
        seen += ids
        dues += [
            t.get_attribute("datetime") or "" for t in page.locator("#scheduled tbody tr td:nth-child(2) time").all()
        ]
        if number_ < 4:
            page.click("#next-page")
    assert seen == head
    assert len(set(seen)) == 100
    assert len(dues) == 100 and dues == sorted(dues)
    assert len(set(dues)) >= 5  # the pages span batches

    # And "First page" goes back to the head
    page.click("#first-page")
    assert "Page 1" in page.locator(".pager").inner_text()
    assert row_ids(page) == head[:25]


def test_search_by_actor_shows_only_that_actors_messages(broker: RedissonBroker, page: Page, dashboard: str) -> None:
    # Given two actors' messages interleaved on one queue
    @dramatiq.actor
    def alpha(i: int) -> None:
        pass

    @dramatiq.actor
    def beta(i: int) -> None:
        pass

    betas = set()
    for i in range(30):
        message = (beta if i % 3 == 0 else alpha).send_with_options(args=(i,), delay=HOUR + i * 1000)
        if i % 3 == 0:
            betas.add(message.message_id)

    # When searching for actor "beta"
    page.goto(dashboard + "queues/default")
    assert len(row_ids(page)) == 25
    search(page, actor="beta")

    # Then only beta's 10 messages are listed
    assert set(row_ids(page)) == betas
    actors = page.locator("#scheduled tbody tr td:nth-child(3)").all_inner_texts()
    assert actors == ["beta"] * 10

    # And a text search narrows it to the one message whose arguments hold it
    search(page, actor="beta", text="[27]")
    assert len(row_ids(page)) == 1
    assert page.locator("#scheduled tbody tr td.args").inner_text() == "27"


def test_cancel_one_message_from_its_row(broker: RedissonBroker, page: Page, dashboard: str) -> None:
    # Given three scheduled messages
    @dramatiq.actor
    def remind(i: int) -> None:
        pass

    ids = [remind.send_with_options(args=(i,), delay=HOUR + i).message_id for i in range(3)]
    page.goto(dashboard + "queues/default")
    assert row_ids(page) == ids

    # When the middle one's "Cancel" is clicked
    page.click(f'#scheduled tr[data-id="{ids[1]}"] button[data-action="cancel"]')

    # Then the page says so and lists the other two; the server no longer holds it
    assert flash(page) == f"Message {ids[1]} cancelled."
    assert row_ids(page) == [ids[0], ids[2]]
    assert broker.delayed_queue("default").get(ids[1]) is None
    assert scheduled_ids(broker) == {ids[0], ids[2]}

    # And a form posted without the page's CSRF token is refused, changing nothing
    response = page.request.post(dashboard + f"queues/default/messages/{ids[0]}/cancel", form={"csrf": "forged"})
    assert response.status == 403
    assert "CSRF" in response.text()
    assert broker.delayed_queue("default").get(ids[0]) is not None


def test_run_now_executes_the_message_on_a_worker(
    broker: RedissonBroker, redis_client: redis.Redis, page: Page, dashboard: str
) -> None:
    # Given two messages due in an hour and a worker consuming their queue
    @dramatiq.actor(max_retries=0)
    def report(i: int) -> None:
        record(redis_client, i=i)

    first = report.send_with_options(args=(1,), delay=HOUR)
    second = report.send_with_options(args=(2,), delay=HOUR)
    worker = Worker(broker, worker_threads=2, worker_timeout=100)
    worker.start()
    try:
        # When the second one's "Run now" is clicked
        page.goto(dashboard + "queues/default")
        page.click(f'#scheduled tr[data-id="{second.message_id}"] button[data-action="promote"]')

        # Then it runs on the worker, and only it
        assert flash(page) == f"Message {second.message_id} set to run now."
        assert wait_for(lambda: len(records(redis_client)) == 1), records(redis_client)
        assert records(redis_client)[0]["i"] == 2
        assert broker.delayed_queue("default").get(second.message_id) is None
        assert scheduled_ids(broker) == {first.message_id}
        page.reload()
        assert row_ids(page) == [first.message_id]

        # And from its detail page the first one runs too
        page.click(f'#scheduled tr[data-id="{first.message_id}"] td a')
        assert page.locator("#args").inner_text().split() == ["[", "1", "]"]
        page.click("#promote")
        assert flash(page) == f"Message {first.message_id} set to run now."
        assert wait_for(lambda: [r["i"] for r in records(redis_client)] == [2, 1]), records(redis_client)
        # (a promoted message is due now: it leaves the schedule when the transfer moves it,
        # which may be just after the page was rendered)
        page.reload()
        assert page.locator("#empty").inner_text() == "Nothing is scheduled on this queue."
    finally:
        worker.stop()


# -- dead letters ----------------------------------------------------------------------


def fails_until_fixed(client: redis.Redis, actor_name: str, error: str, field: str) -> Any:
    """An actor (no retries) that raises ``error`` (formatted with its argument) until the
    key ``test:fixed`` exists, then records its argument as ``field``."""

    def run(value: str) -> None:
        if not client.get("test:fixed"):
            raise RuntimeError(error.format(value))
        record(client, **{field: value})

    run.__name__ = actor_name
    return dramatiq.actor(run, max_retries=0)


def run_until_dead(broker: RedissonBroker) -> tuple[Worker, Any]:
    """Start a worker and wait until the default queue has one dead letter; returns the
    worker (still running: the caller stops it) and that dead letter."""
    worker = Worker(broker, worker_threads=2, worker_timeout=100)
    worker.start()
    try:
        assert wait_for(lambda: broker.dead_letters("default").size() == 1)
    except BaseException:
        worker.stop()
        raise
    [(_, letter)] = broker.dead_letters("default").page(0, 10)
    return worker, letter


def test_requeue_a_dead_letter_after_reading_its_error_and_traceback(
    broker: RedissonBroker, redis_client: redis.Redis, page: Page, dashboard: str
) -> None:
    # Given an actor that fails until a flag is set, run once on a worker: it dies
    sync_account = fails_until_fixed(redis_client, "sync_account", "upstream refused account {}", "account")

    sync_account.send("acme-42")
    worker, letter = run_until_dead(broker)
    redis_id = letter.options["redis_message_id"]
    try:
        # When its queue's dead letters are opened
        page.goto(dashboard + "queues/default/dead")

        # Then its row shows the error, and its detail page the traceback
        row = page.locator(f'#dead tr[data-id="{redis_id}"]')
        assert row.locator("td.warn").inner_text() == "RuntimeError: upstream refused account acme-42"
        assert '"acme-42"' in row.locator("td.args").inner_text()
        row.locator(f'a[href$="/dead/{redis_id}"]').click()
        traceback = page.locator("#traceback").inner_text()
        assert traceback.startswith("Traceback (most recent call last):")
        assert "raise RuntimeError(error.format(value))" in traceback  # the actor's own frame
        assert traceback.rstrip().endswith("RuntimeError: upstream refused account acme-42")

        # When the cause is fixed and "Requeue" clicked
        redis_client.set("test:fixed", 1)
        page.click("#requeue")

        # Then it runs, and is no longer dead
        assert flash(page) == f"Dead letter {redis_id} put back on the ready queue."
        assert wait_for(lambda: [r["account"] for r in records(redis_client)] == ["acme-42"])
        assert broker.dead_letters("default").size() == 0
        assert page.locator("#empty").inner_text() == "No dead letters."
    finally:
        worker.stop()


def test_requeue_all_dead_letters(broker: RedissonBroker, page: Page, dashboard: str) -> None:
    # Given two dead letters of a failing actor (its worker since stopped)
    @dramatiq.actor(max_retries=0)
    def fail(i: int) -> None:
        raise ValueError(f"bad input {i}")

    fail.send(1)
    fail.send(2)
    worker = Worker(broker, worker_threads=2, worker_timeout=100)
    worker.start()
    try:
        assert wait_for(lambda: broker.dead_letters("default").size() == 2)
    finally:
        worker.stop()

    # When "Requeue all…" is clicked on the dead letters page
    page.goto(dashboard + "queues/default/dead")
    assert len(row_ids(page, "#dead")) == 2
    page.click("#all-requeue")

    # Then a confirmation page asks first
    assert page.locator("#question").inner_text() == "Requeue: all 2 dead letters of queue default?"
    assert broker.dead_letters("default").size() == 2

    # When confirmed, then both are back on the ready queue
    page.click("#confirm")
    assert flash(page) == "2 dead letters requeued."
    counts = broker.stats("default")["queues"]["default"]
    assert (counts["dead"], counts["ready"]) == (0, 2)


# -- escaping --------------------------------------------------------------------------


def test_script_in_arguments_is_shown_not_run(broker: RedissonBroker, page: Page, dashboard: str) -> None:
    # Given a message whose arguments are HTML that would run script if not escaped
    @dramatiq.actor
    def greet(name: str, title: str) -> None:
        pass

    message = greet.send_with_options(args=(XSS_SCRIPT, XSS_ATTRIBUTE), delay=HOUR)
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))

    def assert_inert() -> None:
        assert page.evaluate("window.__xss") is None
        # Escaped, not merely blocked by the CSP: no element came from the arguments.
        assert page.locator("img, [onerror]").count() == 0
        assert page.locator("script").count() == 1  # app.js
        assert errors == []

    # When its queue page is opened
    page.goto(dashboard + "queues/default")

    # Then the arguments are shown as text and nothing ran
    args = page.locator(f'#scheduled tr[data-id="{message.message_id}"] td.args').inner_text()
    assert args == f"{json.dumps(XSS_SCRIPT)}, {json.dumps(XSS_ATTRIBUTE)}"
    assert_inert()

    # And so on its detail page
    page.goto(dashboard + f"queues/default/messages/{message.message_id}")
    assert json.loads(page.locator("#args").inner_text()) == [XSS_SCRIPT, XSS_ATTRIBUTE]
    assert_inert()

    # And in the search fields and the flash message, which are taken from the URL
    query = urllib.parse.urlencode({"actor": XSS_SCRIPT, "q": XSS_ATTRIBUTE, "flash": XSS_SCRIPT})
    page.goto(dashboard + "queues/default?" + query)
    assert page.locator("#search-actor").input_value() == XSS_SCRIPT
    assert page.locator("#search-text").input_value() == XSS_ATTRIBUTE
    assert flash(page) == XSS_SCRIPT
    assert_inert()


# -- bulk ------------------------------------------------------------------------------


def test_bulk_cancel_selected(broker: RedissonBroker, page: Page, dashboard: str) -> None:
    # Given 4 messages of "alpha" and 3 of "beta"
    @dramatiq.actor
    def alpha(i: int) -> None:
        pass

    @dramatiq.actor
    def beta(i: int) -> None:
        pass

    alphas = [alpha.send_with_options(args=(i,), delay=HOUR + i * 1000).message_id for i in range(4)]
    betas = [beta.send_with_options(args=(i,), delay=2 * HOUR + i * 1000).message_id for i in range(3)]
    page.goto(dashboard + "queues/default")

    # When two rows are ticked and "Cancel selected" is clicked
    for message_id in alphas[1:3]:
        page.check(f'#scheduled tr[data-id="{message_id}"] input[name="ids"]')
    page.click("#bulk-cancel")

    # Then a confirmation page asks first, and nothing is cancelled yet
    assert page.locator("#question").inner_text() == "Cancel: the 2 selected messages of queue default?"
    assert scheduled_ids(broker) == {*alphas, *betas}

    # When confirmed, then both are gone, from the page and the server
    page.click("#confirm")
    assert flash(page) == "2 scheduled messages cancelled."
    assert row_ids(page) == [alphas[0], alphas[3], *betas]
    assert scheduled_ids(broker) == {alphas[0], alphas[3], *betas}


def test_bulk_run_all_matching_now(
    broker: RedissonBroker, redis_client: redis.Redis, page: Page, dashboard: str
) -> None:
    # Given 2 messages of "alpha" and 3 of "beta", due in hours, and a worker
    @dramatiq.actor(max_retries=0)
    def alpha(i: int) -> None:
        record(redis_client, actor="alpha", i=i)

    @dramatiq.actor(max_retries=0)
    def beta(i: int) -> None:
        record(redis_client, actor="beta", i=i)

    alphas = [alpha.send_with_options(args=(i,), delay=HOUR + i * 1000).message_id for i in range(2)]
    betas = [beta.send_with_options(args=(i,), delay=2 * HOUR + i * 1000).message_id for i in range(3)]
    worker = Worker(broker, worker_threads=2, worker_timeout=100)
    worker.start()
    try:
        # When searching for "beta" and clicking "Run all matching now"
        page.goto(dashboard + "queues/default")
        search(page, actor="beta")
        assert row_ids(page) == betas
        page.click("#all-promote")

        # Then a confirmation page asks first, and nothing has run yet
        question = "Run now: every scheduled message of actor beta of queue default?"
        assert page.locator("#question").inner_text() == question
        assert scheduled_ids(broker) == {*alphas, *betas}
        assert records(redis_client) == []

        # When confirmed, then beta's messages run; alpha's stay scheduled
        page.click("#confirm")
        assert flash(page) == "3 scheduled messages set to run now."
        assert wait_for(lambda: len(records(redis_client)) == 3), records(redis_client)
        assert sorted((r["actor"], r["i"]) for r in records(redis_client)) == [("beta", 0), ("beta", 1), ("beta", 2)]
        assert scheduled_ids(broker) == set(alphas)
    finally:
        worker.stop()


# -- access ----------------------------------------------------------------------------


def test_read_only_dashboard_offers_no_actions_and_refuses_posts(
    broker: RedissonBroker, redis_url: str, page: Page
) -> None:
    # Given a scheduled message and a dashboard started with --read-only
    @dramatiq.actor
    def remind(i: int) -> None:
        pass

    message = remind.send_with_options(args=(1,), delay=HOUR)
    with serve_dashboard(redis_url, "--read-only") as url:
        # When its queue and detail pages are opened
        page.goto(url + "queues/default")

        # Then the message is listed, without any button or checkbox to act on it
        assert "read-only" in page.locator("header .ns").inner_text()
        assert row_ids(page) == [message.message_id]
        assert page.locator("main button:not(#search button)").count() == 0
        assert page.locator("input[type=checkbox]").count() == 0
        page.goto(url + f"queues/default/messages/{message.message_id}")
        assert page.locator("#args").is_visible()
        assert page.locator("main form[method=post]").count() == 0

        # And a forged POST is refused with 403, and changes nothing
        for action in ("cancel", "promote"):
            response = page.request.post(url + f"queues/default/messages/{message.message_id}/{action}", form={})
            assert response.status == 403, action
            assert "read-only" in response.text()
        response = page.request.post(url + "queues/default/bulk", form={"action": "cancel", "scope": "matching"})
        assert response.status == 403
        assert scheduled_ids(broker) == {message.message_id}


def test_basic_auth_asks_for_credentials(broker: RedissonBroker, redis_url: str, browser: Browser, page: Page) -> None:
    # Given a dashboard started with --user and --password-env
    @dramatiq.actor
    def remind(i: int) -> None:
        pass

    remind.send_with_options(args=(1,), delay=HOUR)
    env = {"DASHBOARD_TEST_PASSWORD": "s3cret: with spaces"}
    with serve_dashboard(redis_url, "--user", "ops", "--password-env", "DASHBOARD_TEST_PASSWORD", env=env) as url:
        # When a browser without credentials asks for a page or a static file, then it gets
        # 401 with a challenge (headless Chromium has no login prompt: a navigation
        # fails outright, so the browser context's request API asks)
        for path in ("", "queues/default", "static/style.css", "api/stats"):
            response = page.request.get(url + path)
            assert response.status == 401, path
            assert response.headers["www-authenticate"].startswith("Basic "), path
            assert "Log in" in response.text()

        # And a browser with a wrong password is refused too
        for password in ("wrong", ""):
            context = browser.new_context(http_credentials={"username": "ops", "password": password})
            try:
                response = context.new_page().goto(url)
                assert response is not None and response.status == 401, password
            finally:
                context.close()

        # When it has the credentials, then the overview loads
        context = browser.new_context(http_credentials={"username": "ops", "password": env["DASHBOARD_TEST_PASSWORD"]})
        try:
            authed = context.new_page()
            response = authed.goto(url)
            assert response is not None and response.status == 200
            assert authed.locator('#queues tr[data-queue="default"] td[data-field="scheduled"]').inner_text() == "1"
            # and so do its other pages and static files
            authed.click('#queues tr[data-queue="default"] td a')
            assert authed.locator("#count-scheduled").inner_text() == "1"
            authed.wait_for_load_state("load")
            assert authed.evaluate("getComputedStyle(document.body).margin") == "0px"  # style.css loaded
        finally:
            context.close()


def test_text_search_finds_what_the_page_shows(broker: RedissonBroker, page: Page, dashboard: str) -> None:
    # Given messages whose arguments hold a non-ASCII word and a quoted one
    @dramatiq.actor
    def greet(name: str) -> None:
        pass

    city = greet.send_with_options(args=("Zürich",), delay=HOUR)
    quoted = greet.send_with_options(args=('say "hi"',), delay=HOUR)

    # When searching for each as the page shows it, then each is found
    for text, message in (("Zürich", city), ('"hi"', quoted)):
        page.goto(dashboard + "queues/default?" + urllib.parse.urlencode({"q": text}))
        assert row_ids(page) == [message.message_id], text


def test_pause_a_schedule_from_the_schedules_page(broker: RedissonBroker, page: Page, dashboard: str) -> None:
    from dramatiq_redisson import periodic

    # Given a periodic actor's schedule, stored as the workers of its queue store it
    @periodic(every="60s", name="browser-report")
    @dramatiq.actor(queue_name="reports")
    def nightly_report() -> None:
        pass

    broker.schedules.reconcile("reports")
    # When the operator opens Schedules from the navigation and pauses it, confirming
    page.goto(dashboard)
    page.click("header.top >> text=Schedules")
    row = page.locator('#schedules tr[data-name="browser-report"]')
    assert row.locator('td[data-field="spec"]').inner_text() == "every 1m"
    assert row.locator('td[data-field="paused"]').inner_text() == "no"
    row.locator('button[data-action="pause"]').click()
    assert "Pause schedule browser-report" in page.locator("#question").inner_text()
    assert not broker.schedules.get("browser-report").paused  # asked first
    page.click("#confirm")
    # Then the page says so, and the server holds it paused, its tick unscheduled
    assert flash(page) == "Schedule browser-report paused."
    info = broker.schedules.get("browser-report")
    assert info.paused and info.next_due_ms is None
    assert row.locator('td[data-field="paused"]').inner_text() == "yes"
    assert row.locator('button[data-action="resume"]').count() == 1


def test_open_and_requeue_a_dead_letter_by_its_message_id(
    broker: RedissonBroker, redis_client: redis.Redis, page: Page, dashboard: str
) -> None:
    # Given a scheduled message that died (its redis id: a sort key and its message id)
    charge_card = fails_until_fixed(redis_client, "charge_card", "card declined for {}", "order")

    message_id = charge_card.send_with_options(args=("order-7",), delay=1).message_id
    worker, letter = run_until_dead(broker)
    redis_id = letter.options["redis_message_id"]
    try:
        assert redis_id != message_id and redis_id.endswith(message_id)

        # When the message id from the logs is typed in the dead letters' find box
        page.goto(dashboard + "queues/default/dead")
        row = page.locator(f'#dead tr[data-id="{redis_id}"]')
        assert row.locator('td[data-field="message-id"]').inner_text() == message_id
        assert row.locator('td[data-field="redis-id"]').inner_text() == redis_id
        page.fill("#find-id", message_id)
        page.locator("#find button[type=submit]").click()

        # Then its page opens, naming both ids, with its error
        page.wait_for_selector("#redis-id")
        assert page.locator("#message-id").inner_text() == message_id
        assert page.locator("#redis-id").inner_text() == redis_id
        assert page.locator("#error").inner_text() == "RuntimeError: card declined for order-7"

        # When the cause is fixed and "Requeue" clicked, then it runs
        redis_client.set("test:fixed", 1)
        page.click("#requeue")
        assert flash(page) == f"Dead letter {redis_id} put back on the ready queue."
        assert wait_for(lambda: [r["order"] for r in records(redis_client)] == ["order-7"])
        assert broker.dead_letters("default").size() == 0
    finally:
        worker.stop()


# -- live fleet ------------------------------------------------------------------------


def test_pause_and_resume_a_queue_from_its_page(
    broker: RedissonBroker, redis_client: redis.Redis, page: Page, dashboard: str
) -> None:
    # Given a queue with a worker consuming it
    @dramatiq.actor(max_retries=0)
    def remind(i: int) -> None:
        record(redis_client, i=i)

    remind.send_with_options(args=(0,), delay=HOUR)
    worker = Worker(broker, worker_threads=2, worker_timeout=100)
    worker.start()
    try:
        # When the operator opens it from the overview and clicks "Pause queue…"
        page.goto(dashboard)
        page.click('#queues tr[data-queue="default"] td a')
        assert page.locator("#queue-state").inner_text() == "Active"
        page.click("#pause")

        # Then a confirmation page asks first, and nothing is paused yet
        assert page.locator("#question").inner_text().startswith("Pause queue default? Its consumers, on every worker")
        assert broker.stats("default")["queues"]["default"]["paused"] is False

        # When confirmed, then the server holds it paused, and the page and overview say so
        page.click("#confirm")
        assert flash(page) == "Queue default paused."
        counts = broker.stats("default")["queues"]["default"]
        assert counts["paused"] is True and counts["paused_since_ms"] is not None
        assert page.locator("#queue-state").inner_text() == "Paused"
        assert page.locator("#paused-note").inner_text().startswith("Paused since ")
        page.goto(dashboard)
        assert page.locator('#queues tr[data-queue="default"] .badge.paused').inner_text() == "paused"

        # And a message sent now waits on the ready queue
        remind.send(1)
        page.wait_for_timeout(1000)
        assert records(redis_client) == []
        assert broker.stats("default")["queues"]["default"]["ready"] == 1

        # When resumed from its page (confirmed), then it runs
        page.click('#queues tr[data-queue="default"] td a')
        page.click("#resume")
        page.click("#confirm")
        assert flash(page) == "Queue default resumed."
        assert wait_for(lambda: [r["i"] for r in records(redis_client)] == [1])
        assert broker.stats("default")["queues"]["default"]["paused"] is False
        assert page.locator("#queue-state").inner_text() == "Active"
    finally:
        worker.stop()


def test_the_running_page_shows_what_workers_run_now(broker: RedissonBroker, page: Page, dashboard: str) -> None:
    # Given an export held by its actor on a worker, and a report queue with nothing running
    release = threading.Event()

    @dramatiq.actor(queue_name="exports", max_retries=0)
    def export_account(account: str) -> None:
        release.wait(30)

    @dramatiq.actor(queue_name="reports")
    def build_report() -> None:
        pass

    build_report.send_with_options(delay=HOUR)
    worker = Worker(broker, queues={"exports"}, worker_threads=1, worker_timeout=100)
    worker.start()
    try:
        message = export_account.send("acme-42")
        assert wait_for(lambda: len(broker.running()) == 1)

        # When the operator opens Running from the navigation
        page.goto(dashboard)
        page.click("header.top >> text=Running")

        # Then the export is listed, with its actor, queue, worker and how long it runs
        row = page.locator(f'#running tr[data-id="{message.message_id}"]')
        assert row.locator('td[data-field="actor"]').inner_text() == "export_account"
        assert row.locator('td[data-field="queue"]').inner_text() == "exports"
        host, _, pid = row.locator('td[data-field="worker"]').inner_text().rpartition(":")
        assert host and int(pid) == os.getpid()
        assert int(row.locator('td[data-field="age"]').get_attribute("data-ms") or "-1") >= 0
        assert page.locator("#running-total").inner_text() == "(1)"

        # When filtered to another queue, then nothing is running there
        page.select_option("#running-queue", "reports")
        page.locator("#running-filter button[type=submit]").click()
        page.wait_for_url(lambda url: "queue=reports" in url)
        assert page.locator("#empty").inner_text() == "Nothing is running on queue reports."

        # When the export finishes, then the page no longer lists it
        release.set()
        assert wait_for(lambda: broker.running() == [])
        page.goto(dashboard + "running")
        assert page.locator("#empty").inner_text() == "Nothing is running."
    finally:
        release.set()
        worker.stop()


# -- workflows ---------------------------------------------------------------------------


def test_a_workflows_page_draws_its_tree(broker: RedissonBroker, page: Page, dashboard: str) -> None:
    # Given a done chain with a group (on_failure="continue") whose second member failed
    @dramatiq.actor(max_retries=0)
    def add(*args: Any) -> int:
        return sum(a if isinstance(a, int) else sum(x or 0 for x in a) for a in args)

    @dramatiq.actor(max_retries=0)
    def boom(*args: Any) -> None:
        raise RuntimeError("boom")

    worker = Worker(broker, worker_threads=2, worker_timeout=100)
    worker.start()
    try:
        run = chain(add.message(1), group([add.message(10), boom.message()], on_failure="continue"), add.message())
        workflow = run.run()
        assert workflow.wait(timeout=20).state == "done"

        # When the operator opens Workflows from the navigation, then the workflow's id
        page.goto(dashboard)
        page.click("header.top >> text=Workflows")
        page.click(f'#workflows tr[data-id="{workflow.id}"] a')

        # Then the group is a box inside the chain's box, indented, with its policy
        chain_box = page.locator("#tree > .wf-chain")
        group_box = chain_box.locator(":scope > .wf-children > li > .wf-group")
        assert group_box.get_attribute("data-path") == "1"
        assert group_box.locator('[data-field="on-failure"]').inner_text() == "on_failure=continue"
        outer, inner = chain_box.bounding_box(), group_box.bounding_box()
        assert outer is not None and inner is not None
        assert inner["x"] > outer["x"] and inner["x"] + inner["width"] <= outer["x"] + outer["width"]
        assert outer["y"] < inner["y"] and inner["y"] + inner["height"] <= outer["y"] + outer["height"]

        # And each member's state shows as a badge, the failed one in the dashboard's red
        badges = group_box.locator(".wf-step .badge")
        assert badges.all_inner_texts() == ["done", "failed"]
        assert badges.nth(1).evaluate("e => getComputedStyle(e).color") == "rgb(179, 38, 30)"
    finally:
        worker.stop()
