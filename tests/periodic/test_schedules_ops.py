"""The operator surfaces of periodic actors' schedules, on the real server: the
``dramatiq-redisson schedules`` commands (run as a subprocess, in table and ``--json``
form), the dashboard's Schedules page and its actions (through the WSGI test client), and
the schedule gauges of the metrics."""

from __future__ import annotations

import datetime
import html
import json
import os
import pty
import re
import wsgiref.util
from collections.abc import Iterator
from typing import Any, cast

import dramatiq
import pytest
import redis
from dramatiq import Worker
from dramatiq.message import Message

from dramatiq_redisson import RedissonBroker, ScheduleInfo, Schedules, periodic
from dramatiq_redisson import metrics as m
from dramatiq_redisson.dashboard import make_app
from tests.cli.test_cli import assert_one_line_error, cli_runner, ok_json
from tests.helpers import server_ms, wait_for
from tests.test_metrics import Samples, parse, value
from tests.wsgi_client import Client, Response

EVERY = "ops-every"  # every 30 s, on "default"
BERLIN = "ops-berlin"  # cron */5 in Europe/Berlin, on "reports", with arguments


def iso_ms(ms: int) -> str:
    moment = datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}Z"


def iso_s(ms: int) -> str:
    return datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


@pytest.fixture
def schedules(broker: RedissonBroker) -> Schedules:
    """Two stored schedules, as the workers of their queues store them at start."""

    @periodic(every="30s", name=EVERY)
    @dramatiq.actor(max_retries=0)
    def ops_tick() -> None:
        pass

    @periodic(cron="*/5 * * * *", tz="Europe/Berlin", name=BERLIN, args=(7,), kwargs={"tag": "x"}, catch_up="all")
    @dramatiq.actor(queue_name="reports", max_retries=0)
    def ops_report(i: int, tag: str = "") -> None:
        pass

    assert broker.schedules.reconcile("default") == [EVERY]
    assert broker.schedules.reconcile("reports") == [BERLIN]
    return broker.schedules


def chained_ticks(broker: RedissonBroker, name: str, queue_name: str) -> list[str]:
    """The scheduled (delayed) messages of a schedule's chain on its queue."""
    members = cast("list[bytes]", broker.client.zrange(broker.keys(queue_name).timeout_zset, 0, -1))
    return [member.decode() for member in members if f"periodic:{name}:".encode() in member]


def ready_messages(broker: RedissonBroker, queue_name: str) -> list[Message[Any]]:
    keys = broker.keys(queue_name)
    ids = cast("list[bytes]", broker.client.lrange(keys.ready, 0, -1))
    return [Message.decode(cast(bytes, broker.client.hget(keys.ready_msgs, i))) for i in ids]


def assert_paused(broker: RedissonBroker, name: str, queue_name: str) -> ScheduleInfo:
    info = broker.schedules.get(name)
    assert info.paused is True and info.next_due_ms is None, info
    assert chained_ticks(broker, name, queue_name) == []
    return info


def assert_running(broker: RedissonBroker, name: str, queue_name: str, within_ms: int) -> ScheduleInfo:
    """Not paused, its next tick due within ``within_ms`` and scheduled. No worker runs
    here, so a tick that came due a moment ago (a cron tick at a whole minute) stays
    chained: "due" is from 2 s ago on."""
    info = broker.schedules.get(name)
    now = server_ms(broker.client)
    assert info.paused is False and info.next_due_ms is not None, info
    assert now - 2_000 < info.next_due_ms <= now + within_ms, (info.next_due_ms, now)
    [member] = chained_ticks(broker, name, queue_name)
    assert member.endswith(f":{info.next_due_ms}")
    return info


# -- the command line --------------------------------------------------------------------


@pytest.fixture
def cli(redis_url: str) -> Any:
    """Run ``python -m dramatiq_redisson ARGS`` with ``REDIS_URL`` set to the test server."""
    return cli_runner(redis_url)


def table_rows(text: str) -> dict[str, dict[str, str]]:
    """A ``--plain`` table's rows by their first cell, each as header -> cell."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("name "))
    headers = re.split(r"\s{2,}", lines[start].strip())
    assert set(lines[start + 1]) == {"-", " "}
    rows = {}
    for line in lines[start + 2 :]:
        cells = re.split(r"\s{2,}", line.strip())
        assert len(cells) == len(headers), (headers, cells)
        rows[cells[0]] = dict(zip(headers, cells, strict=True))
    return rows


def test_help_lists_the_schedules_command_and_its_actions(cli: Any) -> None:
    top = cli("--help")
    assert top.returncode == 0 and re.search(r"^\s+schedules\s", top.stdout, re.M)
    group = cli("schedules", "--help")
    assert group.returncode == 0
    for action in ("list", "pause", "resume", "run", "remove"):
        assert re.search(rf"^\s+{action}\s", group.stdout, re.M), action
    assert "--yes" in cli("schedules", "remove", "--help").stdout
    assert "--yes" not in cli("schedules", "pause", "--help").stdout
    assert_one_line_error(cli("schedules", "explode"), 2, "invalid choice: 'explode'")
    assert_one_line_error(cli("schedules", "pause"), 2, "NAME")


def test_list_table_and_json(cli: Any, broker: RedissonBroker, schedules: Schedules) -> None:
    every, berlin = schedules.get(EVERY), schedules.get(BERLIN)
    assert every.next_due_ms is not None and berlin.next_due_ms is not None

    # Table: one row per schedule, by queue then name, with the fields an operator needs
    result = cli("--plain", "schedules", "list")
    assert result.returncode == 0 and result.stderr == ""
    lines = result.stdout.splitlines()
    assert lines[0].startswith("Schedules: 2 · server time ")
    rows = table_rows(result.stdout)
    assert list(rows) == [EVERY, BERLIN]
    row = rows[EVERY]
    assert (row["actor"], row["queue"], row["spec"], row["tz"]) == ("ops_tick", "default", "every 30s", "UTC")
    assert re.fullmatch(rf"{iso_s(every.next_due_ms)} \(in (\d+s|\d+ms)\)", row["next due (UTC)"]), row
    assert (row["last run (UTC)"], row["last lateness (ms)"], row["paused"], row["catch-up"]) == ("-", "-", "no", "one")
    row = rows[BERLIN]
    assert (row["actor"], row["queue"], row["tz"], row["catch-up"]) == ("ops_report", "reports", "Europe/Berlin", "all")
    assert row["spec"] == "cron */5 * * * * (Europe/Berlin)"
    # Within 5 minutes, as `until` words it: whole minutes drop their seconds ("in 3m"), the
    # last second counts ms, and a */5 minute may pass between the fixture and this table
    relative = r"in [1-5]m|in ([1-4]m )?\d+m?s|due now|overdue \d+m?s"
    assert re.fullmatch(rf"{iso_s(berlin.next_due_ms)} \(({relative})\)", row["next due (UTC)"]), row
    assert berlin.next_due_ms % 300_000 == 0  # a */5 minute, whatever the zone's offset
    # `schedules` alone lists them too (rich tables when installed)
    plain_default = cli("--plain", "schedules")
    assert table_rows(plain_default.stdout).keys() == rows.keys()
    assert EVERY in cli("schedules").stdout

    # JSON: every field of ScheduleInfo, times as ms, ISO and relative to the server's time
    document = ok_json(cli("schedules", "list", "--json"))
    assert ok_json(cli("--json", "schedules"))["count"] == 2
    now = server_ms(broker.client)
    assert set(document) == {"namespace", "time_ms", "time", "count", "schedules"}
    assert document["namespace"] == "dramatiq" and document["count"] == 2
    assert abs(document["time_ms"] - now) < 5000 and document["time"] == iso_ms(document["time_ms"])
    by_name = {doc["name"]: doc for doc in document["schedules"]}
    assert list(by_name) == [EVERY, BERLIN]
    for info in (every, berlin):
        doc = by_name[info.name]
        expected = {**info.as_dict(), "declared": False}  # the CLI process declares no actor
        assert {k: doc[k] for k in expected} == expected
        assert doc["next_due"] == iso_ms(info.next_due_ms)  # type: ignore[arg-type]
        assert doc["next_due_in_ms"] == info.next_due_ms - document["time_ms"]
        assert (doc["last_run"], doc["last_run_ago_ms"], doc["waiting_since"]) == (None, None, None)
    assert by_name[BERLIN]["args"] == [7] and by_name[BERLIN]["kwargs"] == {"tag": "x"}
    assert by_name[BERLIN]["cron"] == "*/5 * * * *" and by_name[EVERY]["every_ms"] == 30_000


def test_list_without_schedules_explains(cli: Any, broker: RedissonBroker) -> None:
    result = cli("schedules")
    assert result.returncode == 0 and "No schedules stored" in result.stdout
    assert ok_json(cli("schedules", "--json"))["schedules"] == []


def test_pause_and_resume(cli: Any, broker: RedissonBroker, schedules: Schedules) -> None:
    # Pause: the chained tick is unscheduled and the schedule marked paused
    result = cli("schedules", "pause", EVERY)
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"paused {EVERY!r} (queue 'default')\n"
    assert_paused(broker, EVERY, "default")
    assert_running(broker, BERLIN, "reports", 300_000)  # the other one goes on
    # A second pause changes nothing, and says so
    again = ok_json(cli("schedules", "pause", EVERY, "--json"))
    assert (again["name"], again["queue"], again["changed"], again["paused"]) == (EVERY, "default", False, True)
    assert again["schedule"]["paused"] is True and again["schedule"]["next_due_ms"] is None
    assert "already paused" in cli("schedules", "pause", EVERY).stdout
    # The list shows it paused, with no next tick
    row = table_rows(cli("--plain", "schedules").stdout)[EVERY]
    assert (row["paused"], row["next due (UTC)"]) == ("yes", "- (paused)")

    # Resume: its next tick is scheduled again, in the future
    document = ok_json(cli("schedules", "resume", EVERY, "--json"))
    assert (document["changed"], document["paused"]) == (True, False)
    info = assert_running(broker, EVERY, "default", 30_000)
    assert document["schedule"]["next_due_ms"] == info.next_due_ms
    assert document["schedule"]["next_due_in_ms"] == info.next_due_ms - document["time_ms"]
    # Resuming a running schedule changes nothing (the same tick stays chained)
    again = cli("schedules", "resume", EVERY)
    assert again.returncode == 0 and "was not paused: nothing changed" in again.stdout
    assert again.stdout.startswith(f"{EVERY!r} (queue 'default')")
    assert f"next tick {iso_s(info.next_due_ms)} (in " in again.stdout  # type: ignore[arg-type]
    assert assert_running(broker, EVERY, "default", 30_000).next_due_ms == info.next_due_ms
    # Pause and resume in table form, the paused state is the server's
    assert cli("schedules", "pause", BERLIN).returncode == 0
    assert_paused(broker, BERLIN, "reports")
    resumed = cli("schedules", "resume", BERLIN)
    assert resumed.returncode == 0 and resumed.stdout.startswith(f"resumed {BERLIN!r} (queue 'reports'); next tick ")
    assert_running(broker, BERLIN, "reports", 300_000)


def test_run_sends_a_message_to_the_actors_ready_queue(cli: Any, broker: RedissonBroker, schedules: Schedules) -> None:
    before = schedules.get(BERLIN)
    result = cli("schedules", "run", BERLIN)
    assert result.returncode == 0, result.stderr
    [message] = ready_messages(broker, "reports")
    assert result.stdout == (
        f"sent {BERLIN!r} to run now: message {message.message_id} (actor 'ops_report') "
        "on the ready queue of 'reports'\n"
    )
    assert (message.actor_name, message.queue_name, message.args, message.kwargs) == (
        "ops_report",
        "reports",
        (7,),
        {"tag": "x"},
    )
    assert message.options.get("periodic") == BERLIN
    assert ready_messages(broker, "default") == []
    # The schedule goes on as before: same next tick, still chained
    after = assert_running(broker, BERLIN, "reports", 300_000)
    assert after.next_due_ms == before.next_due_ms and after.last_run_ms is None

    document = ok_json(cli("schedules", "run", EVERY, "--json"))
    [sent] = ready_messages(broker, "default")
    assert (document["name"], document["queue"], document["found"]) == (EVERY, "default", True)
    assert document["message"]["message_id"] == sent.message_id
    assert (document["message"]["actor_name"], document["message"]["queue_name"]) == ("ops_tick", "default")
    assert document["message"]["args"] == [] and document["message"]["options"]["periodic"] == EVERY
    assert len(ready_messages(broker, "reports")) == 1


def test_remove_asks_first(cli: Any, broker: RedissonBroker, schedules: Schedules) -> None:
    # Without a terminal and without --yes: refused, nothing changed
    assert_one_line_error(cli("schedules", "remove", EVERY), 2, f"refusing to remove schedule {EVERY!r}", "--yes")
    assert_running(broker, EVERY, "default", 30_000)
    # On a terminal: asked; "n" keeps it, "y" removes it
    for answer, code in (("n", 1), ("y", 0)):
        controller, terminal = pty.openpty()
        try:
            os.write(controller, f"{answer}\n".encode())
            result = cli("schedules", "remove", EVERY, stdin=terminal)
        finally:
            os.close(terminal)
            os.close(controller)
        assert result.returncode == code, result.stderr
        assert f"Remove schedule {EVERY!r} of queue 'default'? [y/N]" in result.stderr
        if answer == "n":
            assert "Aborted: nothing was changed." in result.stderr
            assert_running(broker, EVERY, "default", 30_000)
    assert result.stdout.startswith(f"removed schedule {EVERY!r} of queue 'default'\n")
    with pytest.raises(KeyError):
        schedules.get(EVERY)
    assert chained_ticks(broker, EVERY, "default") == []
    assert [info.name for info in schedules.list()] == [BERLIN]

    # --yes --json
    document = ok_json(cli("schedules", "remove", BERLIN, "--yes", "--json"))
    assert document == {"name": BERLIN, "queue": "reports", "found": True, "removed": True}
    assert schedules.list() == [] and chained_ticks(broker, BERLIN, "reports") == []
    assert broker.delayed_queue("reports").size() == 0


def test_an_unknown_name_is_an_error_that_changes_nothing(
    cli: Any, broker: RedissonBroker, schedules: Schedules
) -> None:
    before = schedules.list()
    for action in ("pause", "resume", "run", "remove"):
        extra = ("--yes",) if action == "remove" else ()
        result = cli("schedules", action, "nope", *extra)
        assert result.stdout == ""
        assert_one_line_error(result, 1, "no schedule named 'nope'")
        result = cli("schedules", action, "nope", "--json", *extra)
        assert result.returncode == 1
        assert json.loads(result.stdout) == {"name": "nope", "found": False}
    # remove checks the name before asking: not found (1), not "refusing" (2)
    assert_one_line_error(cli("schedules", "remove", "nope"), 1, "no schedule named 'nope'")
    assert schedules.list() == before
    assert ready_messages(broker, "default") == [] and ready_messages(broker, "reports") == []


def test_an_unreadable_definition_hides_only_itself(cli: Any, broker: RedissonBroker, schedules: Schedules) -> None:
    # Given one stored definition that is not JSON, and one whose spec cannot be read
    broker.client.hset(broker.keys("old").schedules, "garbled", "{not json")
    broker.client.hset(broker.keys("old").schedules, "badspec", json.dumps({"actor": "a", "spec": {"cron": "x"}}))
    spec = {"cron": None, "every_ms": 1000, "tz": "UTC"}
    broker.client.hset(broker.keys("old").schedules, "badlimit", json.dumps({"actor": "a", "spec": spec, "limit": "x"}))
    broker.client.sadd("dramatiq:__queues__", "old")
    # Then the others are listed and operated as before
    assert {info.name for info in schedules.list()} == {EVERY, BERLIN}
    assert schedules.pause(EVERY) is True
    assert cli("schedules", "resume", EVERY).returncode == 0
    assert not schedules.get(EVERY).paused


def test_a_name_stored_on_two_queues_is_operated_by_queue(
    cli: Any, broker: RedissonBroker, schedules: Schedules
) -> None:
    # Given the actor of a schedule moved to another queue: its old entry is kept
    keys_old, keys_new = broker.keys("default"), broker.keys("moved")
    broker.client.hset(keys_new.schedules, EVERY, broker.client.hget(keys_old.schedules, EVERY) or b"")
    broker.client.sadd("dramatiq:__queues__", "moved")
    # Then naming it alone is refused as ambiguous, and naming its queue works
    with pytest.raises(ValueError, match="several queues"):
        schedules.get(EVERY)
    assert schedules.get(EVERY, "moved").queue_name == "moved"
    assert schedules.get(EVERY, "default").declared and not schedules.get(EVERY, "moved").declared
    result = cli("schedules", "pause", EVERY)
    assert result.returncode == 1 and "--queue" in result.stderr
    assert cli("schedules", "pause", EVERY, "--queue", "default").returncode == 0
    assert schedules.get(EVERY, "default").paused and not schedules.get(EVERY, "moved").paused


def test_a_waiting_chain_shows_the_tick_it_waits_at(cli: Any, broker: RedissonBroker, schedules: Schedules) -> None:
    # Given the chained tick is gone (an operator cancelled it) and the consumer's check
    # marked the chain waiting, before any worker resumed it
    keys = broker.keys("default")
    [member] = chained_ticks(broker, EVERY, "default")
    assert broker.delayed_queue("default").remove(member[14:])
    now = server_ms(broker.client)
    broker.redisson_scripts.schedule(keys, "check", EVERY, now)
    info = schedules.get(EVERY)
    assert (info.next_due_ms, info.waiting_since_ms, info.paused) == (None, now, False)
    # Then the list says so
    row = table_rows(cli("--plain", "schedules").stdout)[EVERY]
    assert row["next due (UTC)"].startswith(f"waiting since {iso_s(now)} (")
    assert ok_json(cli("schedules", "--json"))["schedules"][0]["waiting_since"] == iso_ms(now)
    # and so does the dashboard
    page = Client(make_app(broker)).get("/schedules")
    assert f'waiting since <time datetime="{iso_ms(now)}"' in cells(page, EVERY)["next_due"]
    # and the next-due gauge holds the tick it waits at
    samples = call_wsgi(m.make_wsgi_app(broker))
    due = value(samples, NEXT_DUE, schedule_name=EVERY, queue_name="default", actor_name="ops_tick")
    assert due == now / 1000


# -- the dashboard -----------------------------------------------------------------------


@pytest.fixture
def client(broker: RedissonBroker) -> Client:
    return Client(make_app(broker))


def cells(page: Response, name: str) -> dict[str, str]:
    """A schedule's row on the Schedules page: field -> cell HTML."""
    row = re.search(rf'<tr data-name="{re.escape(name)}">(.*?)</tr>', page.text, re.S)
    assert row, page.text
    return dict(re.findall(r'data-field="(\w+)">(.*?)</td>', row.group(1), re.S))


def text(cell: str) -> str:
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", cell)).split())


def buttons(page: Response, name: str) -> list[str]:
    """The actions of a schedule's row: each button posts the row's "queue/name" to its action."""
    row = re.search(rf'<tr data-name="{re.escape(name)}">(.*?)</tr>', page.text, re.S)
    assert row
    queue = re.search(r'data-field="queue"><a [^>]*>([^<]*)</a>', row.group(1))
    assert queue
    found = re.findall(r'<button ([^>]*)data-action="(\w+)"', row.group(1))
    for attributes, action in found:
        expected = f'name="name" value="{queue.group(1)}/{name}" formaction="/schedules/{action}"'
        assert expected in attributes, attributes
    return [action for _, action in found]


def confirm_form(page: Response) -> dict[str, list[str]]:
    """The fields the confirmation page posts when its button is clicked."""
    form: dict[str, list[str]] = {}
    for name, field in re.findall(r'<input type="hidden" name="(\w+)" value="([^"]*)"', page.text):
        form.setdefault(name, []).append(html.unescape(field))
    return form


def act(client: Client, action: str, name: str) -> tuple[Response, Response]:
    """Click a row's button (from the Schedules page), then the confirmation's: both answers."""
    token = client.token("/schedules")
    ask = client.post(f"/schedules/{action}", {"csrf": token, "name": name, "next": "/schedules"})
    assert ask.status == 200, ask.text
    action_url = re.search(r'<form method="post" action="([^"]+)">', ask.text)
    assert action_url and action_url.group(1) == f"/schedules/{action}"
    done = client.post(action_url.group(1), confirm_form(ask))
    assert done.status == 303, done.text
    assert done.location()[0] == "/schedules"
    return ask, done


def test_the_schedules_page_lists_every_schedule(broker: RedissonBroker, client: Client, schedules: Schedules) -> None:
    page = client.get("/schedules")
    assert page.status == 200
    assert re.findall(r'<tr data-name="([^"]+)"', page.text) == [EVERY, BERLIN]
    assert 'id="schedules-total">(2)' in page.text
    now = server_ms(broker.client)
    every = schedules.get(EVERY)
    row = {k: text(v) for k, v in cells(page, EVERY).items()}
    assert row == {
        "name": EVERY,
        "actor": "ops_tick",
        "queue": "default",
        "spec": "every 30s",
        "tz": "UTC",
        "next_due": row["next_due"],
        "last_run": "—",
        "last_lateness": "—",
        "paused": "no",
        "catch_up": "one",
        "policy": "-",
        "skipped": "0",
        "dropped": "0",
        "ending": "—",
    }
    assert re.fullmatch(rf"{iso_s(every.next_due_ms)} in \d+s", row["next_due"]), row  # type: ignore[arg-type]
    assert every.next_due_ms is not None and 0 < every.next_due_ms - now <= 30_000
    assert f'<time datetime="{iso_ms(every.next_due_ms)}"' in cells(page, EVERY)["next_due"]
    berlin = {k: text(v) for k, v in cells(page, BERLIN).items()}
    assert (berlin["spec"], berlin["tz"], berlin["catch_up"]) == (
        "cron */5 * * * * (Europe/Berlin)",
        "Europe/Berlin",
        "all",
    )
    assert 'href="/queues/reports"' in cells(page, BERLIN)["queue"]
    assert buttons(page, EVERY) == ["pause", "run", "remove"]
    # Every page links to it
    assert '<a href="/schedules">Schedules</a>' in client.get("/").text
    assert '<a href="/schedules">Schedules</a>' in page.text
    # Without schedules
    schedules.remove(EVERY)
    schedules.remove(BERLIN)
    empty = client.get("/schedules")
    assert empty.status == 200 and 'id="empty"' in empty.text and "<table" not in empty.text


def test_pause_resume_run_and_remove_from_the_page(
    broker: RedissonBroker, client: Client, schedules: Schedules
) -> None:
    # Pause: a confirmation first, nothing changed yet
    token = client.token("/schedules")
    ask = client.post("/schedules/pause", {"csrf": token, "name": EVERY, "next": "/schedules"})
    assert ask.status == 200
    question = html.unescape(re.search(r'<p id="question">(.*?)</p>', ask.text, re.S).group(1))  # type: ignore[union-attr]
    assert question.startswith(f"Pause schedule {EVERY} (every 30s, actor ops_tick) of queue default?")
    assert ">Yes, pause</button>" in ask.text and 'class="primary" id="confirm"' in ask.text
    assert 'href="/schedules">Go back</a>' in ask.text
    assert_running(broker, EVERY, "default", 30_000)
    # Confirmed: paused, its tick unscheduled; the row offers Resume instead of Pause
    _, done = act(client, "pause", EVERY)
    assert done.location()[1]["flash"] == f"Schedule {EVERY} paused."
    assert_paused(broker, EVERY, "default")
    page = client.get("/schedules")
    assert buttons(page, EVERY) == ["resume", "run", "remove"]
    assert text(cells(page, EVERY)["paused"]) == "yes" and text(cells(page, EVERY)["next_due"]) == "— (paused)"
    again = client.post("/schedules/pause", {"csrf": token, "name": EVERY, "confirmed": "yes"})
    assert again.location()[1]["flash"] == f"Schedule {EVERY} was already paused: nothing done."

    # Resume: its next tick is due in the future again
    ask, done = act(client, "resume", EVERY)
    assert ">Yes, resume</button>" in ask.text
    assert done.location()[1]["flash"] == f"Schedule {EVERY} resumed."
    assert_running(broker, EVERY, "default", 30_000)
    again = client.post("/schedules/resume", {"csrf": token, "name": EVERY, "confirmed": "yes"})
    assert again.location()[1]["flash"] == f"Schedule {EVERY} was not paused: nothing done."

    # Run now: a message of its actor, with its arguments, on its queue's ready queue
    ask, done = act(client, "run", BERLIN)
    assert ">Yes, run now</button>" in ask.text
    [message] = ready_messages(broker, "reports")
    assert (message.actor_name, message.args, message.kwargs) == ("ops_report", (7,), {"tag": "x"})
    assert done.location()[1]["flash"] == (
        f"Schedule {BERLIN} sent to run now: message {message.message_id} on queue reports."
    )
    assert_running(broker, BERLIN, "reports", 300_000)

    # Remove: a red confirmation; then gone, its tick cancelled
    ask, done = act(client, "remove", BERLIN)
    assert 'class="primary danger" id="confirm">Yes, remove</button>' in ask.text
    assert done.location()[1]["flash"] == f"Schedule {BERLIN} removed."
    with pytest.raises(KeyError):
        schedules.get(BERLIN)
    assert chained_ticks(broker, BERLIN, "reports") == []
    assert re.findall(r'<tr data-name="([^"]+)"', client.get("/schedules").text) == [EVERY]

    # An unknown (or just removed) name: nothing done, and said so
    for action in ("pause", "resume", "run", "remove"):
        gone = client.post(f"/schedules/{action}", {"csrf": token, "name": BERLIN})
        assert gone.status == 303 and gone.location()[1]["flash"] == f"No schedule named {BERLIN}: nothing done."
    assert len(ready_messages(broker, "reports")) == 1
    # Bad forms and methods
    assert client.post("/schedules/explode", {"csrf": token, "name": EVERY}).status == 404
    assert client.post("/schedules/pause", {"csrf": token}).status == 400
    refused = client.get("/schedules/pause")
    assert refused.status == 405 and refused.headers["Allow"] == "POST"
    # The way back stays on the dashboard
    ask = client.post("/schedules/pause", {"csrf": token, "name": EVERY, "next": "https://evil.example/"})
    assert "evil" not in ask.text
    done = client.post("/schedules/pause", {**confirm_form(ask), "next": "//evil.example/"})
    assert done.location()[0] == "/schedules"


def test_schedule_actions_need_the_csrf_token_and_a_writable_dashboard(
    broker: RedissonBroker, client: Client, schedules: Schedules
) -> None:
    token = client.token("/schedules")
    form = {"name": EVERY, "confirmed": "yes"}
    for action in ("pause", "run", "remove"):
        assert client.post(f"/schedules/{action}", form).status == 403
        assert client.post(f"/schedules/{action}", {**form, "csrf": "0" * 64}).status == 403
        assert Client(client.app).post(f"/schedules/{action}", {**form, "csrf": token}).status == 403
        assert client.post(f"/schedules/{action}", {**form, "csrf": token}, Origin="https://evil.example").status == 403
    assert_running(broker, EVERY, "default", 30_000)
    assert ready_messages(broker, "default") == []

    read_only = Client(make_app(broker, read_only=True))
    page = read_only.get("/schedules")
    assert page.status == 200 and re.findall(r'<tr data-name="([^"]+)"', page.text) == [EVERY, BERLIN]
    assert "data-action" not in page.text and "<th>Actions</th>" not in page.text
    refused = read_only.post("/schedules/pause", {**form, "csrf": "x"})
    assert refused.status == 403 and "read-only" in refused.text
    assert_running(broker, EVERY, "default", 30_000)


def test_values_from_redis_are_escaped_on_the_page(
    broker: RedissonBroker, redis_client: redis.Redis, client: Client, schedules: Schedules
) -> None:
    # A definition written by hand (or by another version) with markup in its actor's name
    keys = broker.keys("default")
    stored = json.loads(cast(bytes, redis_client.hget(keys.schedules, EVERY)))
    stored["actor"] = "<script>alert(1)</script>"
    redis_client.hset(keys.schedules, EVERY, json.dumps(stored))
    page = client.get("/schedules")
    assert page.status == 200
    assert "<script>alert" not in page.text and "&lt;script&gt;alert(1)&lt;/script&gt;" in page.text
    token = client.token("/schedules")
    ask = client.post("/schedules/remove", {"csrf": token, "name": EVERY})
    assert "<script>alert" not in ask.text and "&lt;script&gt;" in ask.text


# -- the metrics -------------------------------------------------------------------------

NEXT_DUE = "dramatiq_redisson_schedule_next_due_timestamp_seconds"
LATENESS = "dramatiq_redisson_schedule_last_lateness_seconds"
PAUSED = "dramatiq_redisson_schedule_paused"


def call_wsgi(app: m.WSGIApp) -> Samples:
    """One scrape of the metrics WSGI app: every sample by name and labels."""
    environ: dict[str, Any] = {}
    wsgiref.util.setup_testing_defaults(environ)
    environ["PATH_INFO"] = "/metrics"
    statuses: list[str] = []
    body = b"".join(app(environ, lambda status, headers, exc_info=None: statuses.append(status)))
    assert statuses == ["200 OK"]
    return parse(body.decode())


def schedule_series(samples: Samples) -> dict[str, dict[str, float]]:
    """Each exported schedule gauge by schedule name (its labels checked)."""
    found: dict[str, dict[str, float]] = {}
    for (name, labels), sample in samples.items():
        if name in (NEXT_DUE, LATENESS, PAUSED):
            found.setdefault(dict(labels)["schedule_name"], {})[name] = sample
    return found


def test_the_metrics_export_each_schedules_gauges(broker: RedissonBroker, schedules: Schedules) -> None:
    every, berlin = schedules.get(EVERY), schedules.get(BERLIN)
    samples = call_wsgi(m.make_wsgi_app(broker))
    labels = {"schedule_name": EVERY, "queue_name": "default", "actor_name": "ops_tick"}
    assert value(samples, NEXT_DUE, **labels) == every.next_due_ms / 1000  # type: ignore[operator]
    assert value(samples, PAUSED, **labels) == 0.0
    assert value(samples, LATENESS, **labels) is None  # no tick ran yet
    berlin_labels = {"schedule_name": BERLIN, "queue_name": "reports", "actor_name": "ops_report"}
    assert value(samples, NEXT_DUE, **berlin_labels) == berlin.next_due_ms / 1000  # type: ignore[operator]
    assert value(samples, "dramatiq_redisson_stats_up") == 1.0

    # Paused: 1, and no next due time
    schedules.pause(EVERY)
    samples = call_wsgi(m.make_wsgi_app(broker))
    assert value(samples, PAUSED, **labels) == 1.0
    assert value(samples, NEXT_DUE, **labels) is None
    assert value(samples, PAUSED, **berlin_labels) == 0.0

    # Only the schedules of the queues exported
    only = call_wsgi(m.make_wsgi_app(broker, queues=["reports"]))
    assert set(schedule_series(only)) == {BERLIN}
    # Removed: gone from the metrics
    schedules.remove(BERLIN)
    assert set(schedule_series(call_wsgi(m.make_wsgi_app(broker)))) == {EVERY}


@pytest.fixture
def fast_worker(broker: RedissonBroker) -> Iterator[Worker]:
    @periodic(every="500ms", name="ops-fast")
    @dramatiq.actor(queue_name="fast", max_retries=0)
    def ops_fast() -> None:
        pass

    worker = Worker(broker, queues={"fast"}, worker_timeout=100, worker_threads=1)
    worker.start()
    yield worker
    worker.stop()


def test_the_metrics_export_the_last_ticks_lateness(broker: RedissonBroker, fast_worker: Worker) -> None:
    # Given a schedule whose ticks a worker ran, then paused (so nothing changes under the scrape)
    assert wait_for(lambda: any(i.last_run_ms for i in broker.schedules.list()), timeout=15)
    broker.schedules.pause("ops-fast")
    info = broker.schedules.get("ops-fast")
    assert info.last_run_ms is not None and info.last_lateness_ms is not None
    # Then the lateness gauge is its last tick's, in seconds
    samples = call_wsgi(m.make_wsgi_app(broker))
    labels = {"schedule_name": "ops-fast", "queue_name": "fast", "actor_name": "ops_fast"}
    assert value(samples, LATENESS, **labels) == max(0, info.last_lateness_ms) / 1000
    assert value(samples, PAUSED, **labels) == 1.0
    # and the CLI's and the page's last run and lateness are the same values
    row = cells(Client(make_app(broker)).get("/schedules"), "ops-fast")
    assert text(row["last_lateness"]) == f"{info.last_lateness_ms:,}"
    assert f'<time datetime="{iso_ms(info.last_run_ms)}"' in row["last_run"]


# -- policies under load (issue 50) --------------------------------------------------------


@pytest.fixture
def policed(broker: RedissonBroker) -> Schedules:
    """A schedule with every policy, one whose window is over, one without any."""
    far = datetime.datetime(2031, 1, 1, tzinfo=datetime.timezone.utc)

    @periodic(every="30s", name="ops-policed", overlap="skip", jitter="10s", start_deadline="1m", end=far, limit=5)
    @periodic(every="30s", name="ops-over", end=datetime.datetime(2020, 1, 1, tzinfo=datetime.timezone.utc))
    @periodic(every="30s", name="ops-plain")
    @dramatiq.actor(max_retries=0)
    def ops_policed() -> None:
        pass

    assert sorted(broker.schedules.reconcile("default")) == ["ops-over", "ops-plain", "ops-policed"]
    # Two ticks skipped (as the transfer counts them), one dropped by its start deadline
    keys = broker.keys("default")
    broker.client.hincrby(keys.schedule_state, "ops-policed|k", 2)
    now = server_ms(broker.client)
    assert broker.redisson_scripts.schedule(keys, "begin", "ops-policed", now - 120_000, now - 60_000) == 0
    return broker.schedules


def test_policies_skipped_and_dropped_counts_and_ends_in_the_api_cli_page_and_metrics(
    cli: Any, broker: RedissonBroker, policed: Schedules
) -> None:
    info, over, plain = (policed.get(n) for n in ("ops-policed", "ops-over", "ops-plain"))
    end_ms = int(datetime.datetime(2031, 1, 1, tzinfo=datetime.timezone.utc).timestamp() * 1000)
    # The API
    assert (info.overlap, info.jitter_ms, info.start_deadline_ms, info.end_ms, info.limit) == (
        "skip",
        10_000,
        60_000,
        end_ms,
        5,
    )
    assert (info.skipped, info.dropped, info.runs, info.runs_left, info.ended) == (2, 1, 0, 5, None)
    assert info.ending() == "window ends 2031-01-01T00:00:00Z, 5 runs left"
    assert (over.ended, over.next_due_ms, over.ending()) == ("end", None, "ended (window over)")
    assert (plain.policy_text(), plain.ending(), plain.skipped, plain.dropped) == ("-", "", 0, 0)
    # The command line, table and JSON
    rows = table_rows(cli("--plain", "schedules", "list").stdout)
    row = rows["ops-policed"]
    assert (row["policy"], row["skipped"], row["dropped"]) == (
        "overlap=skip jitter=10s start_deadline=60s limit=5",
        "2",
        "1",
    )
    assert row["ends"] == "window ends 2031-01-01T00:00:00Z, 5 runs left"
    assert (rows["ops-over"]["next due (UTC)"], rows["ops-over"]["ends"]) == ("- (ended)", "ended (window over)")
    assert (rows["ops-plain"]["policy"], rows["ops-plain"]["ends"]) == ("-", "-")
    docs = {d["name"]: d for d in ok_json(cli("schedules", "list", "--json"))["schedules"]}
    assert (docs["ops-policed"]["skipped"], docs["ops-policed"]["dropped"], docs["ops-policed"]["end"]) == (
        2,
        1,
        iso_ms(end_ms),
    )
    assert (docs["ops-policed"]["runs_left"], docs["ops-over"]["ended"], docs["ops-plain"]["ending"]) == (
        5,
        "end",
        None,
    )
    # The dashboard
    page = Client(make_app(broker)).get("/schedules")
    row_cells = {k: text(v) for k, v in cells(page, "ops-policed").items()}
    assert (row_cells["policy"], row_cells["skipped"], row_cells["dropped"]) == (
        "overlap=skip jitter=10s start_deadline=60s limit=5",
        "2",
        "1",
    )
    assert row_cells["ending"] == "window ends 2031-01-01T00:00:00Z, 5 runs left"
    assert text(cells(page, "ops-over")["ending"]) == "ended (window over)"
    # The metrics
    samples = call_wsgi(m.make_wsgi_app(broker))
    labels = {"schedule_name": "ops-policed", "queue_name": "default", "actor_name": "ops_policed"}
    for gauge, expected in (
        ("skipped_ticks", 2.0),
        ("dropped_ticks", 1.0),
        ("overlap_skip", 1.0),
        ("jitter_seconds", 10.0),
        ("start_deadline_seconds", 60.0),
        ("window_end_timestamp_seconds", end_ms / 1000),
        ("runs_left", 5.0),
        ("ended", 0.0),
    ):
        assert value(samples, f"dramatiq_redisson_schedule_{gauge}", **labels) == expected, gauge
    over_labels = {**labels, "schedule_name": "ops-over"}
    assert value(samples, "dramatiq_redisson_schedule_ended", **over_labels) == 1.0
    assert value(samples, "dramatiq_redisson_schedule_runs_left", **over_labels) is None
