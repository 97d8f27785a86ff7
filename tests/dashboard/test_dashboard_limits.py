"""The dashboard's Limits page through the WSGI test client, on the real server: every
queue's concurrency limits with the slots in use, a queue's waiting groups (those held
back by their group's limit marked), and setting or clearing a queue's limits (confirmed
first, CSRF-checked, refused read-only, bad values refused with nothing written)."""

from __future__ import annotations

import html
import re
from collections.abc import Iterator
from typing import Any

import dramatiq
import pytest
import redis
from dramatiq.middleware import default_middleware

from dramatiq_redisson import RedissonBroker
from dramatiq_redisson.dashboard import make_app
from tests.dashboard.test_live_dashboard import cells, confirmed_form
from tests.helpers import wait_for
from tests.wsgi_client import Client, Response

NO_LIMITS = {"concurrency": None, "group_concurrency": None}


@pytest.fixture
def prioritized(redis_url: str, redis_client: redis.Redis) -> Iterator[RedissonBroker]:
    """A broker whose queues take priorities 0..9 (the ``broker`` fixture's take none)."""
    broker = RedissonBroker(url=redis_url, middleware=[m() for m in default_middleware], max_priority=9)
    dramatiq.set_broker(broker)
    yield broker
    broker.flush_all()
    broker.close()


@pytest.fixture
def client(broker: RedissonBroker) -> Client:
    @dramatiq.actor
    def report(tenant: str) -> None:  # pragma: no cover - never runs
        pass

    return Client(make_app(broker))


def limits_of(broker: RedissonBroker, queue: str = "default") -> dict[str, Any]:
    now = broker.limits.get(queue)
    return {"concurrency": now["concurrency"], "group_concurrency": now["group_concurrency"]}


def question(page: Response) -> str:
    found = re.search(r'<p id="question">(.*?)</p>', page.text, re.S)
    assert found, page.text
    return html.unescape(found.group(1))


# -- the page ----------------------------------------------------------------------------


def test_the_page_lists_every_queues_limits_slots_in_use_and_waiting_groups(prioritized: RedissonBroker) -> None:
    broker = prioritized

    @dramatiq.actor(queue_name="reports")
    def report(tenant: str, n: int) -> None:  # pragma: no cover - fetched, never run
        pass

    @dramatiq.actor
    def plain() -> None:  # pragma: no cover - never runs
        pass

    # Given reports limited to 3 at once and 1 per group, with 3 messages of acme, 2 of
    # globex and 1 urgent one of ops
    broker.limits.set("reports", concurrency=3, group_concurrency=1)
    for n in range(3):
        report.send_with_options(args=("acme", n), group_key="acme")
    for n in range(2):
        report.send_with_options(args=("globex", n), group_key="globex")
    report.send_with_options(args=("ops", 0), group_key="ops", broker_priority=9)
    # And a consumer that fetched all it may: the urgent one, then one of each group, so
    # the queue is at its limit and acme and globex wait for their group's slot
    consumer = broker.consume("reports", prefetch=10, timeout=100)
    fetched = []
    try:
        for _ in range(50):
            message = next(consumer)
            if message is not None:
                fetched.append(message)
            if len(fetched) == 3:
                break
        assert [m.args for m in fetched] == [("ops", 0), ("acme", 0), ("globex", 0)]
        assert wait_for(lambda: broker.limits.get("reports")["lanes_blocked"] == 2)
        # And 2 messages without a group at priority 5, sent after that fetch
        for n in range(2):
            report.send_with_options(args=("batch", n), broker_priority=5)
        plain.send()
        client = Client(make_app(broker))

        # When the Limits page is opened (the navigation links it)
        assert '<a href="/limits">Limits</a>' in client.get("/").text
        page = client.get("/limits")

        # Then every known queue is listed with its limits, slots in use and ready messages
        assert page.status == 200
        assert re.findall(r'<tr data-queue="([^"]+)"', page.text) == ["default", "reports"]
        assert cells(page, 'data-queue="reports"') == {
            "queue": "reports",
            "concurrency": "3",
            "group_concurrency": "1",
            "in_use": "3",
            "groups_in_use": "3",
            "lanes_blocked": "2",
            "rate": "none",
            "group_rate": "none",
            "started_in_window": "—",
            "lanes_deferred": "0",
            "ready": "5",
            "ready_by_priority": "5: 2 · 0: 3",
        }
        assert cells(page, 'data-queue="default"') == {
            "queue": "default",
            "concurrency": "none",
            "group_concurrency": "none",
            "in_use": "0",
            "groups_in_use": "0",
            "lanes_blocked": "0",
            "rate": "none",
            "group_rate": "none",
            "started_in_window": "—",
            "lanes_deferred": "0",
            "ready": "1",
            "ready_by_priority": "—",
        }
        # A queue at its limit and groups waiting for a slot are marked; the count in use
        # leads to what runs
        row = re.search(r'<tr data-queue="reports">(.*?)</tr>', page.text, re.S)
        assert row and 'class="num warn" data-field="in_use"' in row.group(1)
        assert 'class="num warn" data-field="lanes_blocked"' in row.group(1)
        assert 'href="/running?queue=reports"' in row.group(1)
        assert 'href="/limits?queue=reports"' in row.group(1)
        # The page as a whole offers no form that changes anything, nor the waiting groups
        assert 'method="post"' not in page.text and 'id="waiting"' not in page.text

        # When one queue is picked (its tab)
        page = client.get("/limits?queue=reports")
        assert page.status == 200
        assert 'class="active">Limits</a>' in page.text
        assert re.findall(r'<tr data-queue="([^"]+)"', page.text) == ["reports"]
        # Then its waiting lanes are listed, highest priority first, the blocked ones marked
        lanes = re.findall(r'<tr data-lane="([^"]+)"', page.text)
        assert lanes[0] == "5:" and sorted(lanes[1:]) == ["0:acme", "0:globex"]  # the blocked ones in any order
        assert cells(page, 'data-lane="5:"') == {
            "priority": "5",
            "group": "— (no group)",
            "ready": "2",
            "state": "in turn",
        }
        assert cells(page, 'data-lane="0:acme"') == {
            "priority": "0",
            "group": "acme",
            "ready": "2",
            "state": "waiting for a slot",
        }
        assert cells(page, 'data-lane="0:globex"')["state"] == "waiting for a slot"
        assert 'id="lanes-waiting">(3)<' in page.text
        # And the form shows the limits now, to change them
        assert 'id="limits-form"' in page.text
        assert re.search(r'name="concurrency" id="limits-concurrency" value="3"', page.text)
        assert re.search(r'name="group_concurrency" id="limits-group" value="1"', page.text)

        # A queue with nothing waiting says so; an unknown one is a 404; so is a bad refresh a 400
        quiet = client.get("/limits?queue=default")
        assert quiet.status == 200 and "No group is waiting on queue default." in quiet.text
        assert "<tr data-lane=" not in quiet.text
        assert client.get("/limits?queue=nope").status == 404
        assert '<meta http-equiv="refresh" content="5">' in client.get("/limits?refresh=5").text
        assert client.get("/limits?refresh=7").status == 400

        # When the fetched messages end, their slots come back and the page shows it
        for message in fetched:
            consumer.ack(message)
        assert wait_for(lambda: broker.limits.get("reports")["in_use"] == 0)
        row_now = cells(client.get("/limits"), 'data-queue="reports"')
        assert (row_now["in_use"], row_now["groups_in_use"]) == ("0", "0")
    finally:
        consumer.close()


def test_an_empty_namespace_has_no_rows(broker: RedissonBroker) -> None:
    page = Client(make_app(broker)).get("/limits")
    assert page.status == 200 and "<tr data-queue=" not in page.text and 'id="empty"' in page.text


# -- setting and clearing -----------------------------------------------------------------


def test_setting_limits_asks_first_then_writes_them(broker: RedissonBroker, client: Client) -> None:
    token = client.token("/limits?queue=default")
    form = {"csrf": token, "op": "set", "concurrency": "8", "group_concurrency": "1", "next": "/limits?queue=default"}
    # When "Set limits…" is posted, a confirmation page asks first, saying what changes
    ask = client.post("/queues/default/limits", form)
    assert ask.status == 200
    assert question(ask) == (
        "Set the limits of queue default to at most 8 running at once, 1 per group, no rate limit (now no "
        "concurrency limit, no group limit, no rate limit)? It applies to every worker at once: a raised or "
        "removed limit at once, a lowered one at their next fetches. The messages running now finish; "
        "0 of its messages hold a slot now."
    )
    assert ">Yes, set limits</button>" in ask.text
    # And nothing is written yet
    assert limits_of(broker) == NO_LIMITS

    # When confirmed, the limits are written, back on the page it came from
    done = client.post("/queues/default/limits", confirmed_form(ask))
    assert done.status == 303
    path, query = done.location()
    assert (path, query["queue"]) == ("/limits", "default")
    assert query["flash"] == "Limits of queue default set: at most 8 running at once, 1 per group, no rate limit."
    assert limits_of(broker) == {"concurrency": 8, "group_concurrency": 1}
    page = client.get("/limits?queue=default&flash=x")
    assert cells(page, 'data-queue="default"')["concurrency"] == "8"

    # Set makes them exactly those given: an empty field is no limit of that kind
    ask = client.post("/queues/default/limits", {**form, "concurrency": "", "group_concurrency": "2"})
    assert (
        "to no concurrency limit, 2 per group, no rate limit "
        "(now at most 8 running at once, 1 per group, no rate limit)" in question(ask)
    )
    assert limits_of(broker) == {"concurrency": 8, "group_concurrency": 1}
    client.post("/queues/default/limits", confirmed_form(ask))
    assert limits_of(broker) == {"concurrency": None, "group_concurrency": 2}
    # Spaces around a number are fine
    client.post("/queues/default/limits", {**form, "concurrency": " 12 ", "confirmed": "yes"})
    assert limits_of(broker) == {"concurrency": 12, "group_concurrency": 1}


def test_clearing_limits_asks_first_then_removes_them(broker: RedissonBroker, client: Client) -> None:
    broker.limits.set("default", concurrency=4, group_concurrency=2)
    token = client.token("/limits?queue=default")
    # The clear button ignores what the number fields hold
    ask = client.post("/queues/default/limits", {"csrf": token, "op": "clear", "concurrency": "junk"})
    assert ask.status == 200
    assert question(ask) == (
        "Clear the limits of queue default (now at most 4 running at once, 2 per group, no rate limit)? "
        "It applies to every worker at once: any of its waiting messages may start, in every group; "
        "priorities and fair share between groups still apply. The messages running now finish."
    )
    assert ">Yes, clear limits</button>" in ask.text
    assert limits_of(broker) == {"concurrency": 4, "group_concurrency": 2}

    done = client.post("/queues/default/limits", confirmed_form(ask))
    assert done.status == 303
    path, query = done.location()
    assert path == "/limits" and query["queue"] == "default"
    assert query["flash"] == "Limits of queue default cleared: no concurrency limit, no group limit, no rate limit."
    assert limits_of(broker) == NO_LIMITS
    # Clearing again changes nothing, and says so
    again = client.post("/queues/default/limits", {"csrf": token, "op": "clear", "confirmed": "yes"})
    assert again.location()[1]["flash"] == "Queue default had no limits: nothing changed."
    assert limits_of(broker) == NO_LIMITS


@pytest.mark.parametrize(
    "field, value",
    [
        ("concurrency", "0"),
        ("concurrency", "-1"),
        ("concurrency", "1.5"),
        ("concurrency", "eight"),
        ("concurrency", "1e3"),
        ("group_concurrency", "0x10"),
        ("group_concurrency", "\u00b2"),  # a superscript 2: str.isdigit() says yes, int() no
        ("group_concurrency", "\u0661\u0662"),  # Arabic-Indic 12: int() takes it
        ("concurrency", "1000000001"),
        ("concurrency", "9" * 40),
    ],
)
def test_a_bad_limit_is_refused_and_nothing_is_written(
    broker: RedissonBroker, client: Client, field: str, value: str
) -> None:
    broker.limits.set("default", concurrency=5, group_concurrency=3)
    token = client.token("/limits?queue=default")
    form = {"csrf": token, "op": "set", "concurrency": "7", "group_concurrency": "2", field: value}
    for confirmed in ({}, {"confirmed": "yes"}):
        refused = client.post("/queues/default/limits", {**form, **confirmed})
        assert refused.status == 400, refused.text
        assert "must be a whole number from 1 to 1,000,000,000, or empty for no limit" in html.unescape(refused.text)
        assert limits_of(broker) == {"concurrency": 5, "group_concurrency": 3}


def test_set_without_a_limit_or_an_unknown_op_is_refused(broker: RedissonBroker, client: Client) -> None:
    broker.limits.set("default", concurrency=5)
    token = client.token("/limits?queue=default")
    empty = client.post("/queues/default/limits", {"csrf": token, "op": "set", "confirmed": "yes"})
    assert empty.status == 400 and "to remove them all, clear the limits" in empty.text
    blank = {"csrf": token, "op": "set", "concurrency": " ", "group_concurrency": "", "confirmed": "yes"}
    assert client.post("/queues/default/limits", blank).status == 400
    for op in ("", "explode"):
        refused = client.post("/queues/default/limits", {"csrf": token, "op": op, "confirmed": "yes"})
        assert refused.status == 400
    assert limits_of(broker) == {"concurrency": 5, "group_concurrency": None}


def test_an_unknown_queue_is_a_404_and_a_get_a_405(broker: RedissonBroker, client: Client) -> None:
    token = client.token("/limits?queue=default")
    refused = client.post("/queues/nope/limits", {"csrf": token, "op": "set", "concurrency": "2", "confirmed": "yes"})
    assert refused.status == 404
    assert broker.client.exists(broker.keys("nope").flow) == 0  # nothing written
    get = client.get("/queues/default/limits")
    assert get.status == 405 and get.headers["Allow"] == "POST"


def test_changing_limits_needs_a_csrf_token(broker: RedissonBroker, client: Client) -> None:
    token = client.token("/limits?queue=default")
    form = {"op": "set", "concurrency": "2", "confirmed": "yes"}
    path = "/queues/default/limits"
    # No token, a wrong one, the token without its cookie, another browser's, from another site
    assert client.post(path, form).status == 403
    assert client.post(path, {**form, "csrf": "0" * 64}).status == 403
    assert Client(client.app).post(path, {**form, "csrf": token}).status == 403
    other = Client(client.app)
    other.token("/limits?queue=default")
    assert other.post(path, {**form, "csrf": token}).status == 403
    assert client.post(path, {**form, "csrf": token}, Origin="https://evil.example").status == 403
    assert limits_of(broker) == NO_LIMITS
    # The redirect after it stays on the dashboard
    done = client.post(path, {**form, "csrf": token, "next": "https://evil.example/"})
    assert done.status == 303 and done.location()[0] == "/limits"
    assert limits_of(broker) == {"concurrency": 2, "group_concurrency": None}


def test_read_only_shows_the_limits_without_a_form_and_refuses_posts(broker: RedissonBroker) -> None:
    @dramatiq.actor
    def report() -> None:  # pragma: no cover - never runs
        pass

    broker.limits.set("default", concurrency=6, group_concurrency=2)
    read_only = Client(make_app(broker, read_only=True))
    for path in ("/limits", "/limits?queue=default"):
        page = read_only.get(path)
        assert page.status == 200
        row = cells(page, 'data-queue="default"')
        assert (row["concurrency"], row["group_concurrency"]) == ("6", "2")
        assert 'method="post"' not in page.text and 'id="limits-form"' not in page.text
        assert "limits-set" not in page.text and "limits-clear" not in page.text
    assert "No group is waiting on queue default." in read_only.get("/limits?queue=default").text
    for form in (
        {"op": "set", "concurrency": "1", "confirmed": "yes"},
        {"op": "clear", "confirmed": "yes"},
        {"op": "clear"},
    ):
        refused = read_only.post("/queues/default/limits", {"csrf": "x", **form})
        assert refused.status == 403 and "read-only" in refused.text
    assert limits_of(broker) == {"concurrency": 6, "group_concurrency": 2}


def test_numbers_in_other_scripts_are_a_400_not_a_500(broker: RedissonBroker, client: Client) -> None:
    # str.isdigit() takes "²" and int() then fails: every numeric query field refuses it
    broker.declare_queue("default")
    for path in ("/limits?refresh=²", "/running?refresh=²", "/queues/default?n=²", "/queues/default?hours=²"):
        assert client.get(path).status == 400, path
    assert client.get("/queues/default?page=²").status == 200  # a bad page number shows the first page


def test_setting_rates_asks_first_then_writes_them_and_a_rate_needs_its_window(
    broker: RedissonBroker, client: Client, redis_client: redis.Redis
) -> None:
    token = client.token("/limits?queue=default")
    form = {"csrf": token, "op": "set", "rate": "100", "group_rate": "5", "per_ms": "60000"}
    ask = client.post("/queues/default/limits", form)
    assert ask.status == 200
    assert question(ask).startswith(
        "Set the limits of queue default to no concurrency limit, no group limit, 100 starts per 60,000 ms, "
        "5 starts per group per 60,000 ms (now no concurrency limit, no group limit, no rate limit)?"
    )
    assert broker.limits.get("default")["rate"] is None
    client.post("/queues/default/limits", confirmed_form(ask))
    now = broker.limits.get("default")
    assert (now["rate"], now["group_rate"], now["per_ms"]) == (100, 5, 60_000)
    page = client.get("/limits?queue=default")
    shown = cells(page, 'data-queue="default"')
    assert (shown["rate"], shown["group_rate"], shown["started_in_window"]) == (
        "100 / 60,000 ms",
        "5 / 60,000 ms",
        "0",
    )
    assert 'value="60000"' in page.text  # the form shows the window set
    # A rate without its window (or a window alone) is refused, nothing written
    for fields in ({"rate": "10"}, {"per_ms": "1000"}, {"rate": "10", "per_ms": "0"}):
        refused = client.post("/queues/default/limits", {"csrf": token, "op": "set", "confirmed": "yes", **fields})
        assert refused.status == 400, fields
    assert broker.limits.get("default")["rate"] == 100


def test_a_group_waiting_for_its_rate_is_listed_with_when_it_may_start(
    prioritized: RedissonBroker, redis_client: redis.Redis
) -> None:
    @dramatiq.actor(queue_name="reports")
    def report(n: int) -> None:
        pass

    prioritized.limits.set("reports", group_rate=1, per_ms=3_600_000)
    for n in range(3):
        report.send_with_options(args=(n,), group_key="acme")
    consumer = prioritized.consume("reports", prefetch=5, timeout=100)
    taken = []
    for _ in range(20):
        message = next(consumer)
        if message is not None:
            taken.append(message)
        if taken and prioritized.limits.get("reports")["lanes_deferred"] == 1:
            break
    try:
        assert len(taken) == 1
        (lane,) = prioritized.waiting_groups("reports")
        assert lane["group"] == "acme" and lane["ready"] == 2 and lane["blocked"]
        assert lane["until_ms"] is not None and lane["until_ms"] > prioritized.stats("reports")["time_ms"] + 3_000_000
        client = Client(make_app(prioritized))
        page = client.get("/limits?queue=reports")
        assert cells(page, 'data-queue="reports"')["lanes_deferred"] == "1"
        assert "waiting for its rate" in page.text
    finally:
        for message in taken:
            consumer.ack(message)
        consumer.close()


def test_the_page_shows_a_queues_group_weights(broker: RedissonBroker, client: Client) -> None:
    page = client.get("/limits?queue=default")
    assert "every group weighs 1" in page.text
    broker.limits.set_weights("default", {"gold": 3, "<b>": 2})
    page = client.get("/limits?queue=default")
    weights = re.search(r'<p class="small" id="weights">(.*?)</p>', page.text, re.S)
    assert weights is not None
    text = html.unescape(re.sub(r"<[^>]+>", "", weights.group(1)))
    assert text.endswith(": <b> 2, gold 3; every other group 1.")
    assert "<b>" not in weights.group(1)  # escaped
