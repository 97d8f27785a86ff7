"""The live-fleet commands of ``dramatiq-redisson``, run as a subprocess against the real
server: ``pause``/``resume`` (and their effect on a worker and in ``stats``), ``running``
(a message held by a sleeping actor in an in-process worker) and ``history`` (counts of
successes, retries and failures), table and ``--json``; and the sparkline."""

from __future__ import annotations

import os
import re
import subprocess
import threading
import time
from typing import Any

import dramatiq
import pytest
import redis
from dramatiq import Actor, Worker

from dramatiq_redisson import RedissonBroker
from dramatiq_redisson._consumer import consumer_token
from dramatiq_redisson._keys import registry_key
from dramatiq_redisson.cli._live import SPARK_MARKS, ZERO, sparkline
from tests.cli.test_cli import assert_one_line_error, cli_runner, iso_ms, iso_s, ok_json
from tests.helpers import server_ms, wait_for

Run = Any


@pytest.fixture
def cli(redis_url: str) -> Run:
    """Run ``python -m dramatiq_redisson ARGS`` with ``REDIS_URL`` set to the test server."""
    return cli_runner(redis_url)


def ok_text(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    return result.stdout


def plain_table(text: str, first: str) -> list[dict[str, str]]:
    """The rows of the ``--plain`` table whose header line starts with ``first``, each as
    header -> cell (columns cut where the dashed rule under the headers puts them)."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(first + " "))
    spans = [m.span() for m in re.finditer(r"-+", lines[start + 1])]
    assert set(lines[start + 1]) == {"-", " "}

    def cells(line: str) -> list[str]:
        return [line[a:b].strip() for a, b in spans]

    headers = cells(lines[start])
    rows = []
    for line in lines[start + 2 :]:
        if not line.strip() or len(line) < spans[-1][0]:
            break
        rows.append(dict(zip(headers, cells(line), strict=True)))
    return rows


def know(broker: RedissonBroker, *queue_names: str) -> None:
    """Make queues known in the namespace, as a send or a consumer's heartbeat does."""
    broker.client.sadd(registry_key(broker.namespace), *queue_names)


def paused_key_exists(broker: RedissonBroker, queue_name: str) -> bool:
    return bool(broker.client.exists(broker.keys(queue_name).paused))


# -- the sparkline -----------------------------------------------------------------------------


def test_sparkline_marks_zero_apart_scales_to_the_peak_and_groups_a_long_history() -> None:
    assert sparkline([0, 1, 4, 8, 0, 2]) == f"{ZERO}▁▄█{ZERO}▂"
    assert sparkline([0, 0, 0]) == ZERO * 3
    assert sparkline([1]) == "█"
    # One count against a peak of 1000 still shows as the lowest mark, not as zero
    assert sparkline([1, 1000]) == "▁█"
    # 1440 minutes: 60 marks of 24 minutes each; the last mark ends with the last minute
    minutes = [0] * 1440
    minutes[-1] = 5
    minutes[0] = 5
    line = sparkline(minutes)
    assert len(line) == 60 and line == "█" + ZERO * 58 + "█"
    # 90 values in groups of 2: 45 marks, grouped from the end
    assert sparkline([1] + [0] * 89) == "█" + ZERO * 44
    assert set(sparkline(list(range(200)))) <= set(SPARK_MARKS)


# -- pause / resume ----------------------------------------------------------------------------


def test_pause_and_resume_round_trip_their_effect_on_a_worker_and_in_stats(
    cli: Run, broker: RedissonBroker, redis_client: redis.Redis
) -> None:
    done: list[int] = []

    @dramatiq.actor(max_retries=0)
    def note(i: int) -> None:
        done.append(i)

    note.send(0)  # the queue becomes known (and a message waits)
    paused = ok_text(cli("pause", "default"))
    assert paused.startswith("paused 'default': no consumer takes another of its messages until it is resumed")
    assert paused.rstrip().endswith("0 in flight, 1 ready")
    assert paused_key_exists(broker, "default")

    document = ok_json(cli("stats", "--json"))
    now = document["time_ms"]
    queue = document["queues"]["default"]
    assert queue["paused"] is True and 0 <= now - queue["paused_since_ms"] < 10_000
    assert queue["paused_since"] == iso_ms(queue["paused_since_ms"])
    since = queue["paused_since_ms"]

    # Pausing again changes nothing, and says so
    again = ok_text(cli("pause", "default"))
    assert again.startswith(f"'default' was already paused since {iso_s(since)} (")
    assert "nothing changed; 0 in flight, 1 ready" in again

    # The stats table marks it, and its header counts it
    table = ok_text(cli("--plain", "stats"))
    assert "· 1 paused" in table.splitlines()[0]
    [row] = plain_table(table, "queue")
    assert row["queue"] == "default" and re.fullmatch(r"yes \((\d+ms|\d+s)\)", row["paused"]), row

    # A worker started on the paused queue takes nothing...
    worker = Worker(broker, worker_threads=2, worker_timeout=100)
    worker.start()
    try:
        time.sleep(0.8)
        assert done == [] and broker.stats("default")["queues"]["default"]["ready"] == 1
        # ...until resumed: then it runs the waiting message within about a second
        resumed = ok_text(cli("resume", "default"))
        assert re.match(r"resumed 'default' \(paused for \d+s\): its consumers take its messages again", resumed)
        assert not paused_key_exists(broker, "default")
        assert wait_for(lambda: done == [0], timeout=3)
    finally:
        worker.stop()

    assert ok_text(cli("resume", "default")).startswith("'default' was not paused: nothing changed")
    queue = ok_json(cli("stats", "--json", "default"))["queues"]["default"]
    assert queue["paused"] is False and queue["paused_since_ms"] is None and queue["paused_since"] is None
    assert queue["last_hour"] == {"processed": 1, "failed": 0, "retried": 0}


def test_pause_and_resume_json_report_the_change(cli: Run, broker: RedissonBroker, redis_client: redis.Redis) -> None:
    @dramatiq.actor(queue_name="emails")
    def remind(i: int) -> None:
        pass

    remind.send(1)  # the queue becomes known, one message waits
    paused = ok_json(cli("pause", "emails", "--json"))
    now = server_ms(redis_client)
    since = paused["paused_since_ms"]
    assert 0 <= now - since < 5_000 and paused["time_ms"] >= since and paused["time"] == iso_ms(paused["time_ms"])
    del paused["time_ms"], paused["time"]
    assert paused == {
        "queue": "emails",
        "changed": True,
        "paused": True,
        "paused_since_ms": since,
        "paused_since": iso_ms(since),
        "ready": 1,
        "in_flight": 0,
        "consumers": 0,
    }
    # Again: nothing changes, the pause keeps its start
    again = ok_json(cli("--json", "pause", "emails"))
    assert (again["changed"], again["paused"], again["paused_since_ms"]) == (False, True, since)
    resumed = ok_json(cli("resume", "emails", "--json"))
    assert (resumed["changed"], resumed["paused"]) == (True, False)
    assert resumed["paused_since_ms"] is None and resumed["paused_since"] is None and resumed["ready"] == 1
    again = ok_json(cli("resume", "emails", "--json"))
    assert (again["changed"], again["paused"], again["paused_since_ms"]) == (False, False, None)
    assert not paused_key_exists(broker, "emails")


def test_an_unknown_queue_is_refused_with_one_line_and_nothing_written(
    cli: Run, broker: RedissonBroker, redis_client: redis.Redis
) -> None:
    # No queue known at all
    for command in ("pause", "resume"):
        result = cli(command, "nope")
        assert_one_line_error(result, 2, "unknown queue 'nope'", "no queue is known yet")
        assert result.stdout == ""
    know(broker, "default", "emails")
    for name, args in (
        ("nope", ("pause", "nope")),
        ("nope", ("pause", "nope", "--json")),
        ("defualt", ("--json", "resume", "defualt")),
    ):
        result = cli(*args)
        assert_one_line_error(result, 2, f"unknown queue {name!r}", "(known: default, emails)")
        assert result.stdout == ""
    assert redis_client.keys("*paused*") == []
    # A missing queue argument is a usage error too
    assert_one_line_error(cli("pause"), 2, "QUEUE")


# -- running -----------------------------------------------------------------------------------


def test_running_shows_a_sleeping_actors_message_with_its_worker_and_age_then_drops_it(
    cli: Run, broker: RedissonBroker, redis_client: redis.Redis, sleeper: tuple[Actor[[], None], threading.Event]
) -> None:
    sleepy, release = sleeper
    message = sleepy.send()
    assert wait_for(lambda: len(broker.running("slow")) == 1)
    time.sleep(0.4)
    host = consumer_token("x").split(":")[0]

    document = ok_json(cli("running", "--json"))
    now = server_ms(redis_client)
    assert document["queue"] is None and document["count"] == 1
    assert document["time"] == iso_ms(document["time_ms"])
    [entry] = document["messages"]
    assert entry["message_id"] == message.message_id and entry["redis_message_id"] == message.message_id
    assert (entry["actor"], entry["queue"], entry["worker_id"]) == ("sleepy", "slow", broker.broker_id)
    assert (entry["host"], entry["pid"]) == (host, os.getpid())
    assert entry["consumer"].startswith(f"{host}:{os.getpid()}:")
    assert entry["age_ms"] >= 400 and 400 <= now - entry["fetched_ms"] < 10_000
    assert entry["fetched"] == iso_ms(entry["fetched_ms"])
    assert ok_json(cli("running", "slow", "--json"))["messages"][0]["message_id"] == message.message_id

    text = ok_text(cli("--plain", "running", "slow"))
    assert re.fullmatch(r"Running on 'slow': 1 · server time \S+Z", text.splitlines()[0])
    [row] = plain_table(text, "message id")
    assert row["message id"] == message.message_id and row["actor"] == "sleepy" and row["queue"] == "slow"
    assert row["worker"] == f"{host}:{os.getpid()}"
    assert row["fetched (UTC)"] == iso_s(entry["fetched_ms"])
    assert re.fullmatch(r"\d+ms|\d+s", row["age"]), row
    # rich renders the same table
    assert message.message_id in ok_text(cli("running"))

    release.set()
    assert wait_for(lambda: broker.running() == [])
    assert ok_json(cli("running", "--json"))["count"] == 0
    empty = ok_text(cli("running", "slow")).splitlines()
    assert empty[0].startswith("Running on 'slow': 0") and empty[1] == "Nothing running on 'slow'."
    # A name no queue has: refused (a typo would otherwise look like an idle queue)
    typo = cli("running", "slwo")
    assert_one_line_error(typo, 2, "unknown queue 'slwo'", "(known: slow)")
    assert typo.stdout == ""


# -- history -----------------------------------------------------------------------------------


def test_history_counts_successes_retries_and_failures_in_json_text_and_stats(cli: Run, broker: RedissonBroker) -> None:
    flaky_seen: set[int] = set()

    @dramatiq.actor(queue_name="mixed", max_retries=1, min_backoff=1, max_backoff=1)
    def outcome(kind: str, n: int) -> None:
        if kind == "fail":
            raise ValueError("always")
        if kind == "flaky" and n not in flaky_seen:
            flaky_seen.add(n)
            raise ValueError("once")

    worker = Worker(broker, worker_threads=2, worker_timeout=100)
    worker.start()
    try:
        for n, kind in enumerate(["ok"] * 4 + ["fail"] * 2 + ["flaky"]):
            outcome.send(kind, n)
        broker.join("mixed", timeout=10_000)
        worker.join()
    finally:
        worker.stop()
    # ok ×4 and flaky's second run processed; fail ×2 retried once each then dead; flaky's
    # first run retried.
    expected = {"processed": 5, "failed": 2, "retried": 3}

    document = ok_json(cli("history", "mixed", "--json", "--minutes", "5", "--hours", "2"))
    assert set(document) == {"namespace", "time_ms", "time", "minutes", "hours", "queues"}
    assert (document["namespace"], document["minutes"], document["hours"]) == ("dramatiq", 5, 2)
    assert document["time"] == iso_ms(document["time_ms"])
    history = document["queues"]["mixed"]
    assert history["minutes_total"] == history["hours_total"] == expected
    minutes, hours = history["minutes"], history["hours"]
    assert len(minutes) == 5 and len(hours) == 2
    assert {k: sum(b[k] for b in minutes) for k in expected} == expected
    assert {k: sum(b[k] for b in hours) for k in expected} == expected
    assert [b["start_ms"] - minutes[0]["start_ms"] for b in minutes] == [i * 60_000 for i in range(5)]
    # The current minute and hour come last (time_ms is read just after the buckets)
    assert minutes[-1]["start_ms"] <= document["time_ms"] < minutes[-1]["start_ms"] + 61_000
    assert hours[-1]["start_ms"] <= document["time_ms"] < hours[-1]["start_ms"] + 3_601_000
    assert all(b["start"] == iso_ms(b["start_ms"]) for b in minutes + hours)
    # Every known queue without a QUEUE; the defaults are 60 minutes and 24 hours
    every = ok_json(cli("history", "--json"))
    assert set(every["queues"]) == {"mixed"} and (every["minutes"], every["hours"]) == (60, 24)
    assert len(every["queues"]["mixed"]["minutes"]) == 60 and len(every["queues"]["mixed"]["hours"]) == 24
    assert every["queues"]["mixed"]["minutes_total"] == expected

    text = ok_text(cli("--plain", "history", "mixed", "--minutes", "5", "--hours", "2"))
    lines = text.splitlines()
    assert lines[0].startswith("Activity history · server time ") and "namespace 'dramatiq'" in lines[0]
    assert "mixed" in lines
    series = {row[""]: row for row in plain_table(text, "")}
    assert set(series) == {"processed", "failed", "retried"}
    for name, count in expected.items():
        row = series[name]
        assert row["last 5m"] == row["last 2h"] == str(count), row
        per_minute, per_hour = row["per minute, oldest → now"], row["per hour, oldest → now"]
        assert len(per_minute) == 5 and len(per_hour) == 2 and set(per_minute + per_hour) <= {ZERO, *SPARK_MARKS}
        assert per_hour != ZERO * 2 and per_minute.count(ZERO) in (3, 4)  # one or two active minutes
    active = plain_table(text, "minute (UTC)")
    assert 1 <= len(active) <= 2 and re.fullmatch(r"this minute|(\dm )?\d+s ago|\dm ago", active[-1]["when"])
    assert {k: sum(int(r[k]) for r in active) for k in expected} == expected
    assert [r["minute (UTC)"] for r in active] == [iso_s(b["start_ms"]) for b in minutes if any(b[k] for k in expected)]

    # stats carries the last hour's totals, as JSON and in its table
    queue = ok_json(cli("stats", "mixed", "--json"))["queues"]["mixed"]
    assert queue["last_hour"] == queue["last_day"] == expected
    [row] = plain_table(ok_text(cli("--plain", "stats", "mixed")), "queue")
    assert (row["processed 1h"], row["failed 1h"], row["retried 1h"], row["dead"]) == ("5", "2", "3", "2")


def test_history_of_a_quiet_or_unknown_queue_and_bad_windows(cli: Run, broker: RedissonBroker) -> None:
    assert "No known queues" in ok_text(cli("history"))
    assert ok_json(cli("history", "--json"))["queues"] == {}
    know(broker, "default")
    quiet = ok_text(cli("history"))
    assert quiet.splitlines()[2:] == ["default", "No activity in the last 1d."]
    document = ok_json(cli("history", "--json", "--minutes", "1", "--hours", "1"))
    assert document["queues"]["default"]["minutes_total"] == {"processed": 0, "failed": 0, "retried": 0}
    assert len(document["queues"]["default"]["minutes"]) == 1
    typo = cli("history", "defualt", "--hours", "3")
    assert_one_line_error(typo, 2, "unknown queue 'defualt'", "(known: default)")
    assert typo.stdout == ""
    for args, fragment in (
        (("--minutes", "1441"), "expected 1 to 1440 minutes, got 1441"),
        (("--hours", "0"), "expected 1 to 720 hours, got 0"),
    ):
        result = cli("history", *args)
        assert_one_line_error(result, 2, "--" + args[0].lstrip("-"), fragment)
        assert result.stdout == ""


def test_limits_set_show_and_clear_round_trip_and_refuse_bad_values(
    cli: Run, broker: RedissonBroker, redis_client: redis.Redis
) -> None:
    # A queue nobody consumed yet is refused (a typo would limit a queue nobody consumes)
    assert_one_line_error(cli("limits", "set", "reports", "--concurrency", "8"), 2, "not a known queue")
    redis_client.sadd(registry_key("dramatiq"), "reports")  # as a consumer's heartbeat lists it
    shown = ok_text(cli("limits", "show", "reports"))
    assert shown.strip() == (
        "'reports': concurrency none, per group none; 0 running, in 0 groups; 0 groups waiting for a slot"
    )
    set_ = ok_text(cli("limits", "set", "reports", "--concurrency", "8", "--group-concurrency", "1"))
    assert set_.startswith("set 'reports': concurrency 8, per group 1; 0 running")
    assert broker.limits.get("reports")["concurrency"] == 8
    assert ok_json(cli("limits", "show", "reports", "--json")) == {
        "queue": "reports",
        "concurrency": 8,
        "rate": None,
        "per_ms": None,
        "group_concurrency": 1,
        "group_rate": None,
        "in_use": 0,
        "groups_in_use": 0,
        "lanes_blocked": 0,
        "started_in_window": None,
        "lanes_deferred": 0,
    }
    # Bad values: one line on stderr, exit 2, nothing changed
    for args in (("--concurrency", "0"), ("--group-concurrency", "x"), ()):
        result = cli("limits", "set", "reports", *args)
        assert result.returncode == 2 and result.stdout == "" and len(result.stderr.strip().splitlines()) == 1
    assert broker.limits.get("reports")["group_concurrency"] == 1
    cleared = ok_json(cli("limits", "clear", "reports", "--json"))
    assert (cleared["concurrency"], cleared["group_concurrency"]) == (None, None)
    assert cleared["replaced"] == {"concurrency": 8, "group_concurrency": 1}
    # Rates: a rate with its window, shown with the starts in the window
    rated = ok_text(cli("limits", "set", "reports", "--rate", "100", "--group-rate", "5", "--per-ms", "60000"))
    assert rated.strip() == (
        "set 'reports': concurrency none, per group none; rate 100, per group 5, per 60,000 ms; 0 running, "
        "in 0 groups; 0 groups waiting for a slot, 0 started in the window, 0 groups waiting for their rate"
    )
    assert (broker.limits.get("reports")["rate"], broker.limits.get("reports")["per_ms"]) == (100, 60_000)
    for args in (("--rate", "100"), ("--per-ms", "1000"), ("--rate", "0", "--per-ms", "1000")):
        result = cli("limits", "set", "reports", *args)
        assert result.returncode == 2 and result.stdout == "" and len(result.stderr.strip().splitlines()) == 1, args
    assert broker.limits.get("reports")["rate"] == 100
    # Group weights: set exactly, shown, cleared
    weighed = ok_text(cli("limits", "weights", "reports", "gold=3", "a=b=2"))
    assert weighed.strip() == "'reports': a=b 2, gold 3; every other group 1"
    assert ok_json(cli("limits", "weights", "reports", "--json")) == {
        "queue": "reports",
        "weights": {"a=b": 2, "gold": 3},
    }
    for args in (("gold",), ("gold=x",), ("gold=0",), ("gold=2", "--clear")):
        result = cli("limits", "weights", "reports", *args)
        assert result.returncode == 2 and result.stdout == "" and len(result.stderr.strip().splitlines()) == 1, args
    assert ok_text(cli("limits", "weights", "reports", "--clear")).strip() == "'reports': every group weighs 1"


def test_limits_update_changes_one_limit_and_keeps_the_others(
    cli: Run, broker: RedissonBroker, redis_client: redis.Redis
) -> None:
    know(broker, "reports")
    ok_text(cli("limits", "set", "reports", "--concurrency", "8", "--group-concurrency", "1"))
    updated = ok_text(cli("limits", "update", "reports", "--concurrency", "4")).splitlines()
    assert updated[0].startswith("updated 'reports': concurrency 4, per group 1; 0 running")
    assert updated[1:] == ["changed concurrency 8 (now 4)"]
    assert (broker.limits.get("reports")["concurrency"], broker.limits.get("reports")["group_concurrency"]) == (4, 1)
    # none removes one limit; a rate joins the others; JSON says what was replaced
    document = ok_json(cli("limits", "update", "reports", "--group-concurrency", "none", "--json"))
    assert (document["concurrency"], document["group_concurrency"]) == (4, None)
    assert document["replaced"] == {"group_concurrency": 1}
    rated = ok_json(cli("limits", "update", "reports", "--rate", "10", "--per-ms", "1000", "--json"))
    assert (rated["concurrency"], rated["rate"], rated["per_ms"], rated["replaced"]) == (4, 10, 1000, {})
    # Refused, nothing written: no change given, a window dropped from under a rate, a bad value
    before = redis_client.hgetall(broker.keys("reports").flow)
    for args, fragment in (
        ((), "give the limits to change"),
        (("--per-ms", "none"), "need their window"),
        (("--concurrency", "0"), "--concurrency"),
        (("--concurrency", "x"), "--concurrency"),
    ):
        result = cli("limits", "update", "reports", *args)
        assert_one_line_error(result, 2, fragment)
        assert result.stdout == ""
    assert redis_client.hgetall(broker.keys("reports").flow) == before


def test_limits_set_prints_what_it_replaced(cli: Run, broker: RedissonBroker) -> None:
    know(broker, "reports")
    first = ok_text(cli("limits", "set", "reports", "--concurrency", "8", "--group-concurrency", "1"))
    assert len(first.splitlines()) == 1  # nothing was set before: nothing replaced
    text = ok_text(cli("limits", "set", "reports", "--concurrency", "4")).splitlines()
    assert text[0].startswith("set 'reports': concurrency 4, per group none; 0 running")
    assert text[1:] == ["replaced concurrency 8 (now 4), group_concurrency 1 (now none)"]
    document = ok_json(cli("limits", "set", "reports", "--rate", "5", "--per-ms", "1000", "--json"))
    assert document["replaced"] == {"concurrency": 4}
    assert (document["concurrency"], document["rate"], document["per_ms"]) == (None, 5, 1000)
    cleared = ok_text(cli("limits", "clear", "reports")).splitlines()
    assert cleared[0].startswith("cleared 'reports': concurrency none, per group none; 0 running")
    assert cleared[1:] == ["removed rate 5 (now none), per_ms 1000 (now none)"]


def test_limits_get_without_a_queue_lists_every_known_queue_and_show_is_its_alias(
    cli: Run, broker: RedissonBroker
) -> None:
    assert ok_text(cli("limits", "get")).startswith("No known queues")
    assert ok_json(cli("limits", "get", "--json")) == {"queues": []}
    know(broker, "reports", "emails")
    broker.limits.set("reports", concurrency=3)
    lines = ok_text(cli("limits", "get")).splitlines()
    assert [line.split(":")[0] for line in lines] == ["'emails'", "'reports'"]
    assert lines[1].startswith("'reports': concurrency 3, per group none;")
    assert ok_text(cli("limits", "show")).splitlines() == lines
    document = ok_json(cli("limits", "get", "--json"))
    assert [(q["queue"], q["concurrency"]) for q in document["queues"]] == [("emails", None), ("reports", 3)]
    assert ok_json(cli("limits", "show", "reports", "--json"))["concurrency"] == 3
    # An unknown queue is refused, not an invalid choice
    for action in ("get", "show"):
        result = cli("limits", action, "no_such")
        assert_one_line_error(result, 2, "unknown queue 'no_such'", "(known: emails, reports)")
        assert "invalid choice" not in result.stderr
