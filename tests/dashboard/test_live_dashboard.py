"""The dashboard's live-fleet pages (issue 23) through the WSGI test client, on the real
server: pausing and resuming a queue from its page (confirmed, CSRF-checked, refused
read-only), the Running page while an in-process worker holds a message, and the
activity charts after real successes, retries and failures; and the SVG chart functions
(dashboard/_charts.py) on their own."""

from __future__ import annotations

import html
import itertools
import os
import re
import socket
import threading
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator

import dramatiq
import pytest
import redis
from dramatiq import Worker

from dramatiq_redisson import RedissonBroker
from dramatiq_redisson.dashboard import _charts, make_app
from tests.helpers import record, records, wait_for
from tests.wsgi_client import Client, Response

MINUTE, HOUR = 60_000, 3_600_000
#: 2026-11-25T12:00:00Z
NOON = 1_795_608_000_000

BAR_TITLE = re.compile(r"<title>([^<]*): ([\d,]+) processed, ([\d,]+) retried, ([\d,]+) failed</title>")


@pytest.fixture
def client(broker: RedissonBroker) -> Client:
    return Client(make_app(broker))


def confirmed_form(page: Response) -> dict[str, list[str]]:
    """The hidden fields of a confirmation page's form, to post it as its button would."""
    form: dict[str, list[str]] = {}
    for name, value in re.findall(r'<input type="hidden" name="(\w+)" value="([^"]*)"', page.text):
        form.setdefault(name, []).append(html.unescape(value))
    return form


def cells(page: Response, row_attribute: str) -> dict[str, str]:
    """The ``data-field`` cells of the table row ``row_attribute`` names, as text."""
    row = re.search(rf"<tr {row_attribute}>(.*?)</tr>", page.text, re.S)
    assert row, page.text
    found = re.findall(r'<td[^>]*data-field="([\w-]+)"[^>]*>(.*?)</td>', row.group(1), re.S)
    return {name: html.unescape(re.sub(r"<[^>]+>", "", text)).strip() for name, text in found}


def svg_of(page: Response, chart_id: str) -> str:
    found = re.search(rf'<svg [^>]*id="{chart_id}".*?</svg>', page.text, re.S)
    assert found, f"no {chart_id} on the page"
    return found.group(0)


def bar_sums(svg: str) -> dict[str, int]:
    """The counts in the chart's bar tooltips, summed."""
    sums = {"processed": 0, "retried": 0, "failed": 0}
    for _, processed, retried, failed in BAR_TITLE.findall(svg):
        sums["processed"] += int(processed.replace(",", ""))
        sums["retried"] += int(retried.replace(",", ""))
        sums["failed"] += int(failed.replace(",", ""))
    return sums


def my_host() -> str:
    return "".join(c for c in socket.gethostname() if c.isalnum() or c in "-._") or "host"


# -- pause and resume ----------------------------------------------------------------------


def test_pause_and_resume_a_queue_from_its_page(
    broker: RedissonBroker, redis_client: redis.Redis, client: Client, worker: Worker
) -> None:
    @dramatiq.actor(max_retries=0)
    def remind(i: int) -> None:
        record(redis_client, i=i)

    remind.send_with_options(args=(0,), delay=HOUR)  # the queue is known
    # Given an active queue: its page says so and offers to pause it
    page = client.get("/queues/default")
    assert re.search(r'id="queue-state">Active<', page.text) and 'id="pause"' in page.text
    assert 'id="resume"' not in page.text and "badge paused" not in page.text
    token = client.token("/queues/default")

    # When "Pause queue…" is posted, a confirmation page asks first
    ask = client.post("/queues/default/pause", {"csrf": token, "next": "/queues/default?n=50"})
    assert ask.status == 200
    assert html.unescape(ask.text).count("Pause queue default? Its consumers, on every worker, start none") == 1
    assert ">Yes, pause</button>" in ask.text
    assert broker.stats("default")["queues"]["default"]["paused"] is False

    # And once confirmed the queue is paused, back on the page it came from
    done = client.post("/queues/default/pause", confirmed_form(ask))
    assert done.status == 303
    path, query = done.location()
    assert (path, query["n"], query["flash"]) == ("/queues/default", "50", "Queue default paused.")
    counts = broker.stats("default")["queues"]["default"]
    assert counts["paused"] is True and counts["paused_since_ms"] is not None

    # Then the page shows it paused, since when, and offers to resume it; so does the overview
    page = client.get("/queues/default")
    assert re.search(r'id="queue-state">Paused<', page.text) and 'id="resume"' in page.text
    assert 'id="pause"' not in page.text and 'id="paused-note"' in page.text
    assert re.search(r'<h1>default: scheduled messages <span class="badge paused"', page.text)
    overview = client.get("/")
    row = re.search(r'<tr data-queue="default">(.*?)</tr>', overview.text, re.S)
    assert row and 'class="badge paused"' in row.group(1)

    # And the worker starts nothing of it: a message sent now waits
    remind.send(1)
    time.sleep(1.0)
    assert records(redis_client) == []
    assert broker.stats("default")["queues"]["default"]["ready"] == 1

    # Pausing again does nothing, and says so
    again = client.post("/queues/default/pause", {"csrf": token, "confirmed": "yes"})
    assert again.location()[1]["flash"] == "Queue default was already paused: nothing done."

    # When resumed (confirmed), the message runs
    ask = client.post("/queues/default/resume", {"csrf": token})
    assert "Resume queue default?" in html.unescape(ask.text) and ">Yes, resume</button>" in ask.text
    assert broker.stats("default")["queues"]["default"]["paused"] is True
    done = client.post("/queues/default/resume", confirmed_form(ask))
    assert done.location()[1]["flash"] == "Queue default resumed."
    assert wait_for(lambda: [r["i"] for r in records(redis_client)] == [1])
    assert broker.stats("default")["queues"]["default"]["paused"] is False
    again = client.post("/queues/default/resume", {"csrf": token, "confirmed": "yes"})
    assert again.location()[1]["flash"] == "Queue default was not paused: nothing done."


def test_pausing_needs_a_csrf_token_and_is_refused_read_only(broker: RedissonBroker, client: Client) -> None:
    @dramatiq.actor
    def remind(i: int) -> None:
        pass

    remind.send_with_options(args=(1,), delay=HOUR)
    token = client.token("/queues/default")
    confirmed = {"confirmed": "yes"}
    # No token, a wrong one, another browser's, a right one from another site: refused
    assert client.post("/queues/default/pause", confirmed).status == 403
    assert client.post("/queues/default/pause", {**confirmed, "csrf": "0" * 64}).status == 403
    assert Client(client.app).post("/queues/default/pause", {**confirmed, "csrf": token}).status == 403
    foreign = client.post("/queues/default/pause", {**confirmed, "csrf": token}, Origin="https://evil.example")
    assert foreign.status == 403
    assert broker.stats("default")["queues"]["default"]["paused"] is False
    # A GET changes nothing; an unknown queue or action is a 404
    refused = client.get("/queues/default/pause")
    assert refused.status == 405 and refused.headers["Allow"] == "POST"
    assert client.post("/queues/nope/pause", {**confirmed, "csrf": token}).status == 404
    assert client.post("/queues/default/explode", {**confirmed, "csrf": token}).status == 404
    assert broker.stats("default")["queues"]["default"]["paused"] is False
    # The redirect after it stays on the dashboard
    done = client.post("/queues/default/pause", {**confirmed, "csrf": token, "next": "https://evil.example/"})
    assert done.location()[0] == "/queues/default"
    assert broker.resume("default")

    # Read-only: the state shows, without a button; a POST is refused and changes nothing
    read_only = Client(make_app(broker, read_only=True))
    page = read_only.get("/queues/default")
    assert re.search(r'id="queue-state">Active<', page.text) and 'id="pause"' not in page.text
    refused = read_only.post("/queues/default/pause", {"csrf": "x", "confirmed": "yes"})
    assert refused.status == 403 and "read-only" in refused.text
    assert broker.stats("default")["queues"]["default"]["paused"] is False
    assert broker.pause("default")
    page = read_only.get("/queues/default")
    assert re.search(r'id="queue-state">Paused<', page.text) and 'id="resume"' not in page.text
    assert read_only.post("/queues/default/resume", {"confirmed": "yes"}).status == 403
    assert broker.stats("default")["queues"]["default"]["paused"] is True


# -- running now -------------------------------------------------------------------------


@pytest.fixture
def release() -> Iterator[threading.Event]:
    """Set at the end of the test, so that a held actor never outlives it."""
    event = threading.Event()
    yield event
    event.set()


def test_the_running_page_lists_held_messages_oldest_first(
    broker: RedissonBroker, client: Client, release: threading.Event
) -> None:
    @dramatiq.actor(max_retries=0)
    def hold(account: str) -> None:
        release.wait(30)

    @dramatiq.actor(queue_name="other")
    def elsewhere() -> None:
        pass

    worker = Worker(broker, worker_threads=2, worker_timeout=100)
    worker.start()
    try:
        # Given two messages held by a sleeping actor, fetched a moment apart
        first = hold.send("acme")
        assert wait_for(lambda: len(broker.running()) == 1)
        time.sleep(0.05)
        second = hold.send("globex")
        assert wait_for(lambda: len(broker.running()) == 2)
        elsewhere.send_with_options(delay=HOUR)  # a known queue with nothing running

        # When the Running page is opened (the navigation links it)
        assert 'href="/running">Running</a>' in client.get("/").text
        page = client.get("/running")

        # Then both are listed, the longest running first, with their actor, queue and worker
        assert page.status == 200
        assert re.findall(r'<tr data-id="([^"]+)"', page.text) == [first.message_id, second.message_id]
        assert 'id="running-total">(2)<' in page.text
        older, newer = cells(page, f'data-id="{first.message_id}"'), cells(page, f'data-id="{second.message_id}"')
        assert older["message-id"] == first.message_id
        assert (older["actor"], older["queue"], older["worker"]) == ("hold", "default", f"{my_host()}:{os.getpid()}")
        assert (newer["actor"], newer["queue"]) == ("hold", "default")
        ages = [int(ms) for ms in re.findall(r'data-field="age" data-ms="(\d+)"', page.text)]
        assert len(ages) == 2 and ages[0] >= ages[1] >= 0
        assert re.search(r'data-field="fetched"><time datetime="\d{4}-\d\d-\d\dT[\d:.]+Z"', page.text)

        # And per queue: its tab, or none on a queue with nothing running; an unknown one is a 404
        mine = client.get("/running?queue=default")
        assert re.findall(r'<tr data-id="([^"]+)"', mine.text) == [first.message_id, second.message_id]
        assert 'class="active">Running</a>' in mine.text
        other = client.get("/running?queue=other")
        assert other.status == 200 and "<tr data-id=" not in other.text
        assert "Nothing is running on queue other." in other.text
        assert client.get("/running?queue=nope").status == 404
        # The overview's in-flight count leads here
        row = re.search(r'<tr data-queue="default">(.*?)</tr>', client.get("/").text, re.S)
        assert row and 'href="/running?queue=default"' in row.group(1)
        assert '<meta http-equiv="refresh" content="5">' in client.get("/running?refresh=5").text
        assert client.get("/running?refresh=7").status == 400

        # When they finish, the page no longer lists them
        release.set()
        assert wait_for(lambda: broker.running() == [])
        page = client.get("/running")
        assert "<tr data-id=" not in page.text and 'id="empty">Nothing is running.</p>' in page.text
    finally:
        worker.stop()


# -- activity charts ---------------------------------------------------------------------


def test_activity_charts_count_successes_retries_and_failures(
    broker: RedissonBroker, redis_client: redis.Redis, client: Client
) -> None:
    # Given 5 messages that succeed, 2 that fail once and succeed on their retry, and 3
    # that die (no retries)
    @dramatiq.actor(max_retries=1, min_backoff=10, max_backoff=20)
    def flaky(i: int, fail_first: bool) -> None:
        if fail_first and redis_client.incr(f"test:attempts:{i}") == 1:
            raise RuntimeError(f"first attempt of {i}")
        record(redis_client, i=i)

    @dramatiq.actor(max_retries=0)
    def doomed(i: int) -> None:
        raise RuntimeError(f"doomed {i}")

    for i in range(5):
        flaky.send(i, False)
    for i in range(5, 7):
        flaky.send(i, True)
    for i in range(3):
        doomed.send(i)
    expected = {"processed": 7, "retried": 2, "failed": 3}
    worker = Worker(broker, worker_threads=4, worker_timeout=100)
    worker.start()
    try:
        assert wait_for(lambda: broker.stats("default")["queues"]["default"]["last_hour"] == expected, timeout=15), (
            broker.stats("default")
        )
    finally:
        worker.stop()

    # When the queue's page is opened
    page = client.get("/queues/default")
    assert page.status == 200

    # Then both charts count them: in their bars' tooltips, legends and descriptions
    for chart_id in ("chart-minutes", "chart-hours"):
        svg = svg_of(page, chart_id)
        ET.fromstring(svg)  # well-formed
        assert bar_sums(svg) == expected, chart_id
        assert "Processed 7</text>" in svg and "Retried 2</text>" in svg and "Failed 3</text>" in svg
        assert "In total 7 processed, 2 retried, 3 failed." in svg
        assert f'aria-labelledby="{chart_id}-title {chart_id}-desc"' in svg
    minutes = svg_of(page, "chart-minutes")
    assert '<title id="chart-minutes-title">Queue default: messages per minute, last 60 minutes (UTC)</title>' in (
        minutes
    )
    # (a minute may have turned during the run: one or two bars)
    assert 1 <= len(BAR_TITLE.findall(minutes)) <= 2
    # And the data tables hold the same numbers
    table = re.search(r'<table class="data" id="chart-minutes-table">(.*?)</table>', page.text, re.S)
    assert table
    numbers = [int(n) for n in re.findall(r'<td class="num">(\d+)</td>', table.group(1))]
    assert [sum(numbers[0::3]), sum(numbers[1::3]), sum(numbers[2::3])] == [7, 2, 3]

    # And the overview shows the last hour's totals, per queue and in all
    overview = client.get("/")
    row = cells(overview, 'data-queue="default"')
    assert (row["processed_1h"], row["retried_1h"], row["failed_1h"]) == ("7", "2", "3")
    for key, value in expected.items():
        assert re.search(rf'id="last-hour-{key}">{value}\b', overview.text), key
    # And the JSON carries them
    api = client.get("/api/stats").text
    assert '"last_hour": {"processed": 7, "failed": 3, "retried": 2}' in api and '"paused": false' in api

    # The hourly chart over 30 days: 720 bars' room, across the page; other windows refused
    month = client.get("/queues/default?hours=720")
    svg = svg_of(month, "chart-hours")
    assert "messages per hour, last 30 days" in svg and 'viewBox="0 0 1200 210"' in svg
    assert bar_sums(svg) == expected
    assert 'aria-current="true" data-hours="720">30 days<' in month.text
    assert client.get("/queues/default?hours=5").status == 400
    # The window is kept by the search form and the pager
    assert '<input type="hidden" name="hours" value="720">' in month.text


def test_a_queue_with_no_activity_shows_empty_charts(broker: RedissonBroker, client: Client) -> None:
    @dramatiq.actor
    def idle(i: int) -> None:
        pass

    idle.send_with_options(args=(1,), delay=HOUR)
    page = client.get("/queues/default")
    for chart_id in ("chart-minutes", "chart-hours"):
        svg = svg_of(page, chart_id)
        assert "No activity</text>" in svg and '<g class="bar"' not in svg
        assert "No message was processed, retried or failed in this period." in svg
    assert page.text.count("No activity in this period.") == 2
    assert cells(client.get("/"), 'data-queue="default"')["processed_1h"] == "0"


# -- the chart functions -----------------------------------------------------------------


def buckets(counts: list[tuple[int, int, int]], start_ms: int = NOON, width_ms: int = MINUTE) -> list[dict[str, int]]:
    """Buckets from (processed, retried, failed) triples, oldest first."""
    return [
        {"start_ms": start_ms + i * width_ms, "processed": p, "retried": r, "failed": f}
        for i, (p, r, f) in enumerate(counts)
    ]


def rects(svg: str, series: str) -> list[dict[str, float]]:
    root = ET.fromstring(svg)
    found = []
    for rect in root.iter("{http://www.w3.org/2000/svg}rect"):
        if rect.get("data-series") == series and rect.get("fill") != "transparent":
            found.append({k: float(rect.get(k, "0")) for k in ("x", "y", "width", "height")})
    return found


def test_nice_ceiling_ticks_and_compact_numbers() -> None:
    assert [_charts.nice_ceiling(v) for v in (0, 1, 2, 3, 6, 11, 99, 101, 4_294_967_295)] == [
        1,
        1,
        2,
        5,
        10,
        20,
        100,
        200,
        5_000_000_000,
    ]
    assert _charts.y_ticks(1) == [0, 1]
    assert _charts.y_ticks(2) == [0, 1, 2]
    assert _charts.y_ticks(5) == [0, 1, 2, 3, 4, 5]
    assert _charts.y_ticks(20) == [0, 4, 8, 12, 16, 20]
    assert [_charts.compact(n) for n in (0, 950, 9_500, 12_000, 1_500_000, 5_000_000_000)] == [
        "0",
        "950",
        "9,500",
        "12k",
        "1.5M",
        "5G",
    ]
    assert _charts.period_label(NOON + 5 * MINUTE, MINUTE) == "2026-11-25 12:05 UTC"
    assert _charts.period_label(NOON + 23 * HOUR, HOUR) == "2026-11-26 11:00–12:00 UTC"


def test_a_chart_of_all_zeros() -> None:
    svg = _charts.bar_chart(buckets([(0, 0, 0)] * 60), width_ms=MINUTE, chart_id="z", title="Nothing")
    root = ET.fromstring(svg)
    assert root.get("role") == "img" and root.get("aria-labelledby") == "z-title z-desc"
    assert "No activity</text>" in svg and '<g class="bar"' not in svg
    assert "Processed 0</text>" in svg and "Retried 0</text>" in svg and "Failed 0</text>" in svg
    assert "No message was processed, retried or failed in this period." in svg
    # a 0..1 axis, and clock-aligned time labels every 10 minutes
    labels = [t.text for t in root.iter("{http://www.w3.org/2000/svg}text")]
    assert "0" in labels and "1" in labels
    assert [label for label in labels if label and ":" in label] == [f"12:{m}0" for m in range(6)]
    assert _charts.rows(buckets([(0, 0, 0)] * 60), MINUTE) == []
    # and without any bucket at all
    ET.fromstring(_charts.bar_chart([], width_ms=HOUR, chart_id="empty", title="None"))


def test_one_huge_value_leaves_the_small_ones_visible() -> None:
    huge = 4_294_967_295  # the most a counter holds
    data = buckets([(0, 0, 0)] * 10 + [(huge, 1, 0)] + [(0, 0, 0)] * 5 + [(0, 0, 1)] + [(3, 0, 0)])
    svg = _charts.bar_chart(data, width_ms=MINUTE, chart_id="huge", title="Huge")
    root = ET.fromstring(svg)
    # The axis goes to a nice 5G
    labels = [t.text for t in root.iter("{http://www.w3.org/2000/svg}text")]
    assert "5G" in labels
    # Every non-zero segment shows, none overflows the plot
    plot_top, plot_bottom = _charts.TOP, _charts.HEIGHT - _charts.BOTTOM
    for series in ("processed", "retried", "failed"):
        for rect in rects(svg, series):
            assert rect["height"] >= _charts.MIN_SEGMENT - 0.01, (series, rect)
            assert plot_top - 0.01 <= rect["y"] and rect["y"] + rect["height"] <= plot_bottom + 0.01
    assert len(rects(svg, "processed")) == 2 and len(rects(svg, "retried")) == 1 and len(rects(svg, "failed")) == 1
    # The exact numbers are in the tooltips and the description
    titles = BAR_TITLE.findall(svg)
    assert titles == [
        ("2026-11-25 12:10 UTC", "4,294,967,295", "1", "0"),
        ("2026-11-25 12:16 UTC", "0", "0", "1"),
        ("2026-11-25 12:17 UTC", "3", "0", "0"),
    ]
    assert "The busiest minute, 2026-11-25 12:10 UTC, had 4,294,967,296." in svg
    assert [row.period for row in _charts.rows(data, MINUTE)] == [
        "2026-11-25 12:17 UTC",
        "2026-11-25 12:16 UTC",
        "2026-11-25 12:10 UTC",
    ]


def test_bars_are_proportional_and_series_differ_by_more_than_colour() -> None:
    svg = _charts.bar_chart(buckets([(10, 0, 0), (5, 5, 0), (0, 0, 2)]), width_ms=MINUTE, chart_id="p", title="P")
    processed = rects(svg, "processed")
    assert [round(r["height"] / processed[1]["height"], 3) for r in processed] == [2.0, 1.0]
    # retried stacks on processed
    (retried,) = rects(svg, "retried")
    assert abs(retried["y"] + retried["height"] - processed[1]["y"]) < 0.01
    # Retried and failed are patterns (stripes, cross-hatching), named in the legend
    root = ET.fromstring(svg)
    patterns = {p.get("id") for p in root.iter("{http://www.w3.org/2000/svg}pattern")}
    assert patterns == {"p-retried", "p-failed"}
    assert 'fill="url(#p-retried)"' in svg and 'fill="url(#p-failed)"' in svg
    assert "retried orange, striped; failed red, cross-hatched" in svg


def test_hourly_labels_and_escaping() -> None:
    start = NOON - 29 * 24 * HOUR - 12 * HOUR  # 30 days of hours, from midnight
    svg = _charts.bar_chart(
        buckets([(1, 0, 0)] * 720, start, HOUR), width_ms=HOUR, chart_id="m", title="<b>q</b> & co", width=1200
    )
    root = ET.fromstring(svg)
    labels = [t.text for t in root.iter("{http://www.w3.org/2000/svg}text")]
    days = [label for label in labels if label and label[:3] in ("Oct", "Nov")]
    assert len(days) == 15 and days[0] in ("Oct 27", "Oct 28")  # every other (UTC) day
    assert all(int(b[4:]) - int(a[4:]) in (2, -29) for a, b in itertools.pairwise(days))
    assert '<title id="m-title">&lt;b&gt;q&lt;/b&gt; &amp; co</title>' in svg
    day = _charts.bar_chart(buckets([(1, 0, 0)] * 24, NOON, HOUR), width_ms=HOUR, chart_id="d", title="D")
    hours = [t.text for t in ET.fromstring(day).iter("{http://www.w3.org/2000/svg}text")]
    assert [label for label in hours if label and ":" in label] == [f"{h:02d}:00" for h in (12, 15, 18, 21, 0, 3, 6, 9)]
    for bad in ("", "a b", 'x" onload="y', "é"):
        with pytest.raises(ValueError, match="chart_id"):
            _charts.bar_chart([], width_ms=HOUR, chart_id=bad, title="t")
    with pytest.raises(ValueError, match="width"):
        _charts.bar_chart([], width_ms=HOUR, chart_id="w", title="t", width=100)
