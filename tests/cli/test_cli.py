"""The ``dramatiq-redisson`` command line, run as a subprocess against the real server:
every command in table and ``--json`` form, exit codes, effects on the server."""

from __future__ import annotations

import datetime
import json
import os
import pty
import re
import socket
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import dramatiq
import pytest
import redis
from dramatiq import Actor
from dramatiq.message import Message

from dramatiq_redisson import RedissonBroker
from dramatiq_redisson._keys import registry_key
from dramatiq_redisson.cli import COMMANDS, parse_duration, span
from tests.helpers import server_ms

Run = Callable[..., subprocess.CompletedProcess[str]]


def iso_ms(ms: int) -> str:
    moment = datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}Z"


def iso_s(ms: int) -> str:
    return datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def base_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "DRAMATIQ_REDISSON_PLAIN", "NO_COLOR")}
    env.update(extra)
    return env


@pytest.fixture
def cli(redis_url: str) -> Run:
    """Run ``python -m dramatiq_redisson ARGS`` with ``REDIS_URL`` set to the test server."""
    return cli_runner(redis_url)


def cli_runner(redis_url: str) -> Run:
    """What the :func:`cli` fixture gives (other test modules make their fixture of it)."""

    def run(*args: str, env: dict[str, str] | None = None, url: bool = True, **kwargs: Any) -> Any:
        environment = base_env(**({"REDIS_URL": redis_url} if url else {}))
        environment.update(env or {})
        kwargs.setdefault("stdin", subprocess.DEVNULL)
        return subprocess.run(
            [sys.executable, "-m", "dramatiq_redisson", *args],
            env=environment,
            capture_output=True,
            text=True,
            timeout=60,
            **kwargs,
        )

    return run


def ok_json(result: subprocess.CompletedProcess[str]) -> Any:
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    return json.loads(result.stdout)


def assert_one_line_error(result: subprocess.CompletedProcess[str], code: int, *fragments: str) -> None:
    assert result.returncode == code, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


@pytest.fixture
def actors(broker: RedissonBroker) -> tuple[Actor[..., None], Actor[..., None]]:
    return two_actors()


def two_actors() -> tuple[Actor[..., None], Actor[..., None]]:
    """Two do-nothing actors on the default queue of the current broker (the :func:`actors`
    fixture's; other test modules make their fixture of it)."""

    @dramatiq.actor(max_retries=0)
    def alpha(i: int, tag: str = "") -> None:
        pass

    @dramatiq.actor(max_retries=0)
    def beta(i: int, tag: str = "") -> None:
        pass

    return alpha, beta


def schedule(actor: Actor[..., None], i: int, delay: int, tag: str = "") -> str:
    return actor.send_with_options(args=(i,), kwargs={"tag": tag}, delay=delay).message_id


def bury(broker: RedissonBroker, message: Message[Any], died_ms: int) -> str:
    """Write a dead letter as the broker's nack leaves it (``.XQ`` layout), on a queue the
    namespace's registry lists (the consumer that nacked it listed it)."""
    keys = broker.keys(message.queue_name)
    broker.client.sadd(keys.registry, keys.queue_name)
    broker.client.zadd(keys.xq, {message.message_id: died_ms})
    broker.client.hset(keys.xq_msgs, message.message_id, message.encode())
    return message.message_id


def ready_ids(broker: RedissonBroker, queue_name: str = "default") -> list[str]:
    listed = cast("list[bytes]", broker.client.lrange(broker.keys(queue_name).ready, 0, -1))
    return [member.decode() for member in listed]


# -- pure helpers ----------------------------------------------------------------------


def test_durations_and_spans() -> None:
    assert [parse_duration(t) for t in ("90s", "10m", "1h30m", "2d", "500ms", "1.5h", "1w")] == [
        90_000,
        600_000,
        5_400_000,
        172_800_000,
        500,
        5_400_000,
        604_800_000,
    ]
    for bad in ("30", "10x", "", "m", "-5s", "20y"):
        with pytest.raises(Exception, match="duration"):
            parse_duration(bad)
    assert [span(ms) for ms in (850, 45_000, 200_000, 3_900_000, 5_399_990, 183_600_000, 86_400_000)] == [
        "850ms",
        "45s",
        "3m 20s",
        "1h 5m",
        "1h 30m",
        "2d 3h",
        "1d",
    ]


# -- stats and watch ---------------------------------------------------------------------


def test_help_lists_every_command(cli: Run) -> None:
    result = cli("--help", url=False)
    assert result.returncode == 0
    for command in COMMANDS:
        assert re.search(rf"^\s+{command}\s", result.stdout, re.M), command
    metrics = cli("metrics", "--help", url=False)
    assert metrics.returncode == 0 and "--port" in metrics.stdout and "--host" in metrics.stdout


def test_stats_table_and_json(
    cli: Run, broker: RedissonBroker, actors: tuple[Actor[..., None], Actor[..., None]]
) -> None:
    alpha, _ = actors

    @dramatiq.actor(queue_name="emails")
    def remind(i: int) -> None:
        pass

    for i, delay in enumerate((600_000, 1_200_000, 1_800_000)):
        schedule(alpha, i, delay)
    remind.send_with_options(args=(1,), delay=7_200_000)
    alpha.send(99)  # ready
    bury(broker, alpha.message(7), server_ms(broker.client) - 120_000)
    # Queues become known through consumers' heartbeats (none run here): register them as they do.
    broker.client.sadd(registry_key("dramatiq"), "default", "emails")

    document = ok_json(cli("stats", "--json"))
    now = server_ms(broker.client)
    assert set(document) == {"namespace", "time_ms", "time", "workers", "queues"}
    assert document["namespace"] == "dramatiq" and document["workers"] == 0
    assert abs(document["time_ms"] - now) < 5000 and document["time"] == iso_ms(document["time_ms"])
    assert set(document["queues"]) == {"default", "emails"}
    default = document["queues"]["default"]
    next_due = broker.delayed_queue("default").next_due()
    # The ready message has waited since it was sent, a moment before
    assert 0 <= default.pop("latency_ms") < 60_000
    assert default == {
        "ready": 1,
        "ready_by_priority": {},
        "lanes_waiting": 0,
        "in_flight": 0,
        "scheduled": 3,
        "overdue": 0,
        "next_due_ms": next_due,
        "next_due": iso_ms(next_due),  # type: ignore[arg-type]
        "next_due_in_ms": next_due - document["time_ms"],
        "dead": 1,
        "consumers": 0,
        "transfer_holder": None,
        "legacy_delayed": 0,
        "paused": False,
        "paused_since_ms": None,
        "paused_since": None,
        "unknown_actor": 0,
        "last_hour": {"processed": 0, "failed": 0, "retried": 0},
        "last_day": {"processed": 0, "failed": 0, "retried": 0},
    }
    assert 590_000 < default["next_due_in_ms"] <= 600_000
    assert document["queues"]["emails"]["scheduled"] == 1
    # One queue only
    assert set(ok_json(cli("--json", "stats", "emails"))["queues"]) == {"emails"}

    table = cli("stats")
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert "namespace 'dramatiq'" in lines[0] and "0 live workers" in lines[0]
    header = next(line for line in lines if line.startswith("queue"))
    titles = ("ready", "latency", "in flight", "scheduled", "overdue", "next due", "dead", "processed 1h")
    for title in (*titles, "failed 1h", "retried 1h", "consumers", "paused", "lease holder"):
        assert title in header
    row = next(line for line in lines if line.startswith("default")).split()
    assert row[:2] == ["default", "1"] and re.fullmatch(r"\d+(ms|s)", row[2]), row  # the ready one's wait
    assert row[3:6] == ["0", "3", "0"]
    assert row[6] == iso_s(next_due)  # type: ignore[arg-type]
    assert re.fullmatch(r"\(in (9m [2-5]\ds|10m)\) 1 0 0 0 0 no -", " ".join(row[7:])), row
    assert "\x1b[" not in table.stdout  # no colour off a terminal


def test_stats_without_known_queues_explains(cli: Run, redis_client: redis.Redis) -> None:
    result = cli("stats")
    assert result.returncode == 0
    assert "No known queues" in result.stdout
    assert ok_json(cli("stats", "--json"))["queues"] == {}


def test_plain_fallback_and_rich_tables(cli: Run, actors: tuple[Actor[..., None], Actor[..., None]]) -> None:
    alpha, _ = actors
    schedule(alpha, 1, 600_000)
    rich_out = cli("stats", "default").stdout
    plain_env = cli("stats", "default", env={"DRAMATIQ_REDISSON_PLAIN": "1"}).stdout
    plain_flag = cli("--plain", "stats", "default").stdout
    assert "─" in rich_out and "---" not in rich_out
    for plain in (plain_env, plain_flag):
        lines = plain.splitlines()
        header, rule, row = lines[1], lines[2], lines[3]
        assert "─" not in plain and set(rule) == {"-", " "}
        # Columns line up: each header starts where its dashes start, numbers end where they end.
        starts = [m.start() for m in re.finditer(r"-+", rule)]
        ends = [m.end() for m in re.finditer(r"-+", rule)]
        assert [header.index(t) for t in ("queue", "next due", "lease holder")] == [starts[0], starts[6], starts[13]]
        assert row[ends[4] - 1] == "1" and row.startswith("default")
        assert all(line == line.rstrip() for line in lines)


def test_plain_and_json_are_taken_after_the_command_too(
    cli: Run, actors: tuple[Actor[..., None], Actor[..., None]]
) -> None:
    alpha, _ = actors
    schedule(alpha, 1, 600_000)
    for args in (("--plain", "stats", "default"), ("stats", "default", "--plain")):
        result = cli(*args)
        assert result.returncode == 0, (args, result.stderr)
        lines = result.stdout.splitlines()
        # A plain table: no rich rules, a dashed rule under the headers.
        assert "─" not in result.stdout and set(lines[2]) == {"-", " "}, (args, result.stdout)
        assert lines[1].split()[:3] == ["queue", "ready", "latency"] and lines[3].startswith("default"), args
    for args in (("--json", "stats", "default"), ("stats", "default", "--json")):
        assert ok_json(cli(*args))["queues"]["default"]["scheduled"] == 1, args


def test_watch_runs_count_refreshes(cli: Run, actors: tuple[Actor[..., None], Actor[..., None]]) -> None:
    alpha, _ = actors
    schedule(alpha, 1, 600_000)
    table = cli("watch", "default", "--count", "2", "--interval", "0.2")
    assert table.returncode == 0, table.stderr
    assert [line for line in table.stdout.splitlines() if line.startswith("refresh")] == [
        "refresh 1 · every 0.2s · Ctrl-C exits",
        "refresh 2 · every 0.2s · Ctrl-C exits",
    ]
    assert table.stdout.count("\ndefault ") == 2
    documents = [json.loads(line) for line in cli("watch", "default", "--count", "2", "--json").stdout.splitlines()]
    assert len(documents) == 2 and all(d["queues"]["default"]["scheduled"] == 1 for d in documents)
    assert documents[1]["time_ms"] > documents[0]["time_ms"]


# -- scheduled messages ------------------------------------------------------------------


def test_list_table_json_filters_and_limit(
    cli: Run, broker: RedissonBroker, actors: tuple[Actor[..., None], Actor[..., None]]
) -> None:
    alpha, beta = actors
    ids = [schedule(alpha, i, 600_000 + i * 60_000, tag=f"invoice-{i % 2}") for i in range(5)]
    ids += [schedule(beta, i, 60_000 + i * 1000, tag="x" * 200) for i in (5, 6)]
    dq = broker.delayed_queue("default")

    document = ok_json(cli("list", "default", "--json"))
    assert set(document) == {"queue", "time_ms", "time", "scheduled", "count", "truncated", "messages"}
    assert (document["scheduled"], document["count"], document["truncated"]) == (7, 7, False)
    in_due_order = ids[5:] + ids[:5]
    assert [m["message_id"] for m in document["messages"]] == in_due_order
    first = document["messages"][0]
    due, message = dq.get(ids[5])  # type: ignore[misc]
    assert first["due_ms"] == due and first["due"] == iso_ms(due)
    assert first["due_in_ms"] == due - document["time_ms"] and 55_000 < first["due_in_ms"] <= 65_000
    assert (first["actor_name"], first["args"], first["kwargs"]) == ("beta", [5], {"tag": "x" * 200})
    assert first["queue_name"] == "default" and first["options"]["redis_message_id"].endswith(ids[5])
    assert first["message_timestamp"] == message.message_timestamp

    def listed(*args: str) -> list[str]:
        return [m["message_id"] for m in ok_json(cli("list", "default", "--json", *args))["messages"]]

    assert listed("--actor", "alpha") == ids[:5]
    assert listed("--match", "invoice-1") == [ids[1], ids[3]]
    assert listed("--actor", "beta", "--match", "invoice-1") == []
    limited = ok_json(cli("list", "default", "--json", "--limit", "2"))
    assert [m["message_id"] for m in limited["messages"]] == in_due_order[:2] and limited["truncated"] is True
    assert listed("--limit", "0") == in_due_order

    table = cli("list", "default", "--limit", "3")
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].startswith("Scheduled on 'default': 7 in all")
    for title in ("due (UTC)", "when", "message id", "actor", "retries", "arguments"):
        assert title in lines[1]
    rows = [line for line in lines if any(i in line for i in ids)]
    assert [next(i for i in ids if i in row) for row in rows] == in_due_order[:3]
    assert rows[0].startswith(iso_s(due)) and re.search(r"\bin (1m( [0-5]s)?|[3-5]\ds)\b", rows[0])
    assert "beta" in rows[0] and '5, tag="xxxx' in rows[0] and rows[0].endswith("…")
    assert re.search(r"in (10m|9m [2-5]\ds)\s+" + ids[0] + r"\s+alpha\s+0\s+0, tag=\"invoice-0\"$", rows[2])
    assert "--limit 0 lists all" in lines[-1]
    filtered = cli("list", "default", "--actor", "nobody").stdout
    assert "No scheduled message matches." in filtered


def test_show_table_json_and_unknown(
    cli: Run, broker: RedissonBroker, actors: tuple[Actor[..., None], Actor[..., None]]
) -> None:
    alpha, _ = actors
    message_id = alpha.send_with_options(args=(3,), kwargs={"tag": "t"}, delay=3_600_000, max_retries=2).message_id
    due, _ = broker.delayed_queue("default").get(message_id)  # type: ignore[misc]

    document = ok_json(cli("show", "default", message_id, "--json"))
    assert (document["found"], document["queue"], document["message_id"]) == (True, "default", message_id)
    assert document["message"]["due_ms"] == due and document["message"]["options"]["max_retries"] == 2
    assert document["time"] == iso_ms(document["time_ms"]) and document["message"]["due"] == iso_ms(due)
    assert document["message"]["args"] == [3] and document["message"]["kwargs"] == {"tag": "t"}

    table = cli("show", "default", message_id)
    assert table.returncode == 0
    text = table.stdout
    assert message_id in text.splitlines()[0]
    assert re.search(rf"due\s+{re.escape(iso_ms(due))} \(in (1h|59m [2-5]\ds)\)", text)
    assert re.search(r"actor\s+alpha", text) and re.search(r"args\s+\[3\]", text)
    assert '"max_retries": 2' in text

    missing = cli("show", "default", "no-such-id")
    assert missing.stdout == ""
    assert_one_line_error(missing, 1, "not scheduled: no-such-id")
    missing_json = cli("show", "default", "no-such-id", "--json")
    assert missing_json.returncode == 1
    assert json.loads(missing_json.stdout) == {"queue": "default", "message_id": "no-such-id", "found": False}


def test_cancel_ids_all_and_confirmation(
    cli: Run, broker: RedissonBroker, actors: tuple[Actor[..., None], Actor[..., None]]
) -> None:
    alpha, beta = actors
    a = [schedule(alpha, i, 600_000) for i in range(3)]
    b = [schedule(beta, i, 600_000) for i in range(2)]
    dq = broker.delayed_queue("default")

    result = cli("cancel", "default", a[0], "nope", a[1])
    assert result.returncode == 1
    assert result.stdout.splitlines() == [f"cancelled {a[0]}", f"cancelled {a[1]}"]
    assert_one_line_error(result, 1, "not scheduled: nope")
    assert a[0] not in dq and a[1] not in dq and a[2] in dq

    document = json.loads(cli("cancel", "default", a[2], "--json").stdout)
    assert document == {"queue": "default", "count": 1, "cancelled": [a[2]], "not_found": []}

    refused = cli("cancel", "default", "--all")
    assert_one_line_error(refused, 2, "refusing to cancel every scheduled message", "--yes")
    assert dq.size() == 2
    assert_one_line_error(cli("cancel", "default", b[0], "--all", "--yes"), 2, "not both")
    assert_one_line_error(cli("cancel", "default"), 2, "message ids, or --all")
    alpha_again = schedule(alpha, 9, 600_000)
    document = ok_json(cli("cancel", "default", "--all", "--actor", "beta", "--yes", "--json"))
    assert document == {"queue": "default", "count": 2, "all": True, "actor_name": "beta"}
    assert dq.size() == 1 and alpha_again in dq


def test_confirmation_on_a_terminal(
    cli: Run, broker: RedissonBroker, actors: tuple[Actor[..., None], Actor[..., None]]
) -> None:
    alpha, _ = actors
    message_id = schedule(alpha, 1, 600_000)
    dq = broker.delayed_queue("default")
    for answer, code in (("n", 1), ("y", 0)):
        controller, terminal = pty.openpty()
        try:
            os.write(controller, f"{answer}\n".encode())
            result = cli("cancel", "default", "--all", stdin=terminal)
        finally:
            os.close(terminal)
            os.close(controller)
        assert result.returncode == code, result.stderr
        assert "Cancel every scheduled message on queue 'default'? [y/N]" in result.stderr
        assert (message_id in dq) is (answer == "n")
    assert "Aborted" not in result.stderr and result.stdout == "Cancelled 1 scheduled message on 'default'.\n"


def test_reschedule_in_at_and_bad_times(
    cli: Run, broker: RedissonBroker, actors: tuple[Actor[..., None], Actor[..., None]]
) -> None:
    alpha, _ = actors
    message_id = schedule(alpha, 1, 600_000)
    dq = broker.delayed_queue("default")

    before = server_ms(broker.client)
    result = cli("reschedule", "default", message_id, "--in", "1h30m")
    after = server_ms(broker.client)
    due = dq.get(message_id)[0]  # type: ignore[index]
    assert before + 5_400_000 <= due <= after + 5_400_000
    assert result.returncode == 0
    assert re.fullmatch(rf"rescheduled {message_id}: due {iso_s(due)} \(in (1h 30m|1h 29m [2-5]\ds)\)\n", result.stdout)

    document = ok_json(cli("reschedule", "default", message_id, "--at", "2030-01-01T09:00+01:00", "--json"))
    assert dq.get(message_id)[0] == 1_893_484_800_000 == document["due_ms"]  # type: ignore[index]
    assert document["due"] == "2030-01-01T08:00:00.000Z" and document["rescheduled"] is True
    assert set(document) == {"queue", "message_id", "rescheduled", "due_ms", "due", "due_in_ms"}

    for args, fragment in (
        (("--at", "2030-06-01T08:00"), "has no timezone"),
        (("--at", "tomorrow"), "ISO 8601"),
        (("--in", "30"), "needs a unit"),
        (("--in", "30s", "--at", "2030-06-01T08:00Z"), "not allowed with"),
        ((), "one of the arguments --in --at is required"),
    ):
        assert_one_line_error(cli("reschedule", "default", message_id, *args), 2, fragment)
    assert dq.get(message_id)[0] == 1_893_484_800_000  # type: ignore[index]
    missing = cli("reschedule", "default", "nope", "--in", "5m", "--json")
    assert missing.returncode == 1 and json.loads(missing.stdout)["rescheduled"] is False


def test_promote_ids_and_all(
    cli: Run, broker: RedissonBroker, actors: tuple[Actor[..., None], Actor[..., None]]
) -> None:
    alpha, beta = actors
    a = [schedule(alpha, i, 600_000) for i in range(3)]
    b = schedule(beta, 9, 600_000)
    dq = broker.delayed_queue("default")

    result = cli("promote", "default", a[0], "nope")
    assert result.returncode == 1 and result.stdout == f"promoted (due now) {a[0]}\n"
    assert_one_line_error(result, 1, "not scheduled: nope")
    # No worker runs here, so it stays scheduled, due now.
    assert dq.get(a[0])[0] <= server_ms(broker.client)  # type: ignore[index]
    assert dq.get(a[1])[0] > server_ms(broker.client) + 500_000  # type: ignore[index]

    assert_one_line_error(cli("promote", "default", "--all"), 2, "refusing to run every scheduled message")
    assert_one_line_error(cli("promote", "default", a[1], "--actor", "alpha"), 2, "--actor goes with --all")
    # a[0] is due already: the others are promoted
    document = ok_json(cli("promote", "default", "--all", "--actor", "alpha", "--yes", "--json"))
    assert document == {"queue": "default", "count": 2, "all": True, "actor_name": "alpha"}
    now = server_ms(broker.client)
    assert all(dq.get(i)[0] <= now for i in a)  # type: ignore[index]
    assert dq.get(b)[0] > now + 500_000  # type: ignore[index]
    table = cli("promote", "default", "--all", "--yes")
    assert table.stdout == "Promoted 1 scheduled message on 'default': due now.\n"
    assert dq.get(b)[0] <= server_ms(broker.client)  # type: ignore[index]


# -- dead letters -----------------------------------------------------------------------


def test_dead_list_show_requeue_purge(
    cli: Run, broker: RedissonBroker, actors: tuple[Actor[..., None], Actor[..., None]]
) -> None:
    alpha, beta = actors
    now = server_ms(broker.client)
    failed = alpha.message(1, tag="t").copy(options={"retries": 3, "traceback": "Traceback...\nValueError: boom\n"})
    ids = [bury(broker, failed, now - 300_000)]
    ids += [bury(broker, beta.message(i), now - 60_000 + i) for i in range(4)]
    keys = broker.keys("default")

    document = ok_json(cli("dead", "list", "default", "--json", "--limit", "3"))
    assert set(document) == {"queue", "time_ms", "time", "dead", "count", "truncated", "messages"}
    assert (document["dead"], document["count"], document["truncated"]) == (5, 3, True)
    oldest = document["messages"][0]
    assert oldest["redis_message_id"] == ids[0] and oldest["died_ms"] == now - 300_000
    assert oldest["died"] == iso_ms(now - 300_000) and 300_000 <= oldest["died_ago_ms"] < 310_000
    assert oldest["error"] == "ValueError: boom" and oldest["options"]["retries"] == 3
    assert [m["redis_message_id"] for m in document["messages"]] == ids[:3]

    table = cli("dead", "list", "default")
    assert table.returncode == 0
    lines = table.stdout.splitlines()
    assert lines[0].startswith("Dead letters of 'default': 5")
    row = next(line for line in lines if ids[0] in line)
    assert re.match(
        rf"{ids[0]}\s+{ids[0]}\s+{iso_s(now - 300_000)}\s+5m( [0-5]?\ds)? ago\s+"
        rf"alpha\s+3\s+ValueError: boom\s+1, tag=\"t\"$",
        row,
    )

    shown = ok_json(cli("dead", "show", "default", ids[0], "--json"))
    assert shown["found"] is True and shown["message"]["redis_message_id"] == ids[0]
    shown_table = cli("dead", "show", "default", ids[0]).stdout
    assert "ValueError: boom" in shown_table and re.search(r"retries\s+3", shown_table)
    assert_one_line_error(cli("dead", "show", "default", "nope"), 1, "no dead letter nope")

    # Requeue one: it leaves the dead letters for the ready queue
    result = cli("dead", "requeue", "default", ids[1], "nope")
    assert result.returncode == 1 and result.stdout == f"requeued {ids[1]}\n"
    assert_one_line_error(result, 1, "no dead letter nope on queue 'default'")
    assert ready_ids(broker) == [ids[1]]
    assert broker.client.hexists(keys.ready_msgs, ids[1]) and broker.dead_letters("default").get(ids[1]) is None

    assert_one_line_error(cli("dead", "requeue", "default", "--all"), 2, "refusing to requeue every dead letter")
    assert_one_line_error(cli("dead", "purge", "default", ids[2]), 2, "refusing to delete 1 dead letter")
    assert broker.dead_letters("default").size() == 4

    purged = ok_json(cli("dead", "purge", "default", ids[2], "--yes", "--json"))
    assert purged == {"queue": "default", "count": 1, "removed": [ids[2]], "not_found": []}
    assert not broker.client.hexists(keys.xq_msgs, ids[2]) and not broker.client.hexists(keys.ready_msgs, ids[2])

    requeued = ok_json(cli("dead", "requeue", "default", "--all", "--yes", "--json"))
    assert requeued == {"queue": "default", "count": 3, "all": True}
    assert sorted(ready_ids(broker)) == sorted([ids[0], ids[1], ids[3], ids[4]])
    assert broker.stats("default")["queues"]["default"]["ready"] == 4

    bury(broker, beta.message(42), now)
    assert cli("dead", "purge", "default", "--all", "--yes").stdout == "Deleted 1 dead letter of 'default'.\n"
    assert broker.dead_letters("default").size() == 0
    empty = cli("dead", "list", "default")
    assert empty.returncode == 0 and "No dead letters." in empty.stdout


# -- connecting and errors ---------------------------------------------------------------


def test_connection_and_usage_errors(cli: Run) -> None:
    closed = cli("--url", "redis://127.0.0.1:1/0", "stats", url=False)
    assert_one_line_error(closed, 2, "cannot reach the Redis server at 127.0.0.1:1/0")
    assert closed.stdout == ""
    assert_one_line_error(cli("list", "default", "--json", url=False), 2, "no broker")
    assert_one_line_error(cli("--url", "http://x", "stats", url=False), 2, "invalid --url")
    assert_one_line_error(cli("stat"), 2, "unknown command 'stat'")
    assert_one_line_error(cli("list", "default", "--limit", "-1"), 2, "--limit")
    assert_one_line_error(cli("no_such_module_here:broker", "stats"), 2, "cannot import broker module")
    assert_one_line_error(cli("json:dumps", "stats"), 2, "calling 'json:dumps' failed")


def test_dashboard_usage_errors(cli: Run) -> None:
    help = cli("dashboard", "--help", url=False)
    assert help.returncode == 0
    for option in ("--port", "--host", "--read-only", "--user", "--password-env", "--prefix"):
        assert option in help.stdout, option
    assert_one_line_error(cli("dashboard", "--user", "ops"), 2, "--user needs --password-env")
    missing = cli("dashboard", "--user", "ops", "--password-env", "NO_SUCH_VAR_HERE")
    assert_one_line_error(missing, 2, "--user needs --password-env", "'NO_SUCH_VAR_HERE'")
    assert_one_line_error(cli("dashboard", "--password-env", "HOME"), 2, "--password-env needs --user")
    assert_one_line_error(cli("dashboard", "--prefix", "ops"), 2, "prefix must be a path")
    assert_one_line_error(cli("dashboard", "--port", "70000"), 2, "port")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        assert_one_line_error(cli("dashboard", "--port", port), 2, f"cannot serve the dashboard on 127.0.0.1:{port}")


def test_metrics_on_a_taken_port_is_refused_before_it_says_it_serves(cli: Run) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        for json_flag in ((), ("--json",)):
            result = cli("metrics", "--port", port, *json_flag)
            assert_one_line_error(result, 2, f"cannot serve metrics on 127.0.0.1:{port}", "--port")
            assert result.stdout == "" and "Serving" not in result.stderr


def test_broker_import_path(cli: Run, redis_url: str, redis_client: redis.Redis, tmp_path: Path) -> None:
    (tmp_path / "shop_app.py").write_text(
        textwrap.dedent(
            """
            import os
            import dramatiq
            from dramatiq_redisson import RedissonBroker

            broker = RedissonBroker(url=os.environ["SHOP_REDIS_URL"], namespace="shop")
            dramatiq.set_broker(broker)

            @dramatiq.actor(queue_name="emails")
            def remind(user_id):
                pass

            if os.environ.get("SHOP_SEED"):
                remind.send_with_options(args=(7,), delay=600_000)
            """
        )
    )
    (tmp_path / "builtin_app.py").write_text(
        "from dramatiq.brokers.redis import RedisBroker\nbroker = RedisBroker(url='redis://127.0.0.1:1')\n"
    )
    env = {"PYTHONPATH": str(tmp_path), "SHOP_REDIS_URL": redis_url}
    ok_json(cli("shop_app", "list", "emails", "--json", env={**env, "SHOP_SEED": "1"}, url=False))
    # The module's queues are known from its actors; its namespace is the broker's.
    for target in ("shop_app", "shop_app:broker"):
        document = ok_json(cli(target, "stats", "--json", env=env, url=False))
        assert document["namespace"] == "shop" and set(document["queues"]) == {"emails"}
        assert document["queues"]["emails"]["scheduled"] == 1
    assert redis_client.zcard("redisson_delay_queue_timeout:{shop:emails}") == 1
    # The directory can also come from --path (the current directory by default)
    listed = cli("--path", str(tmp_path), "shop_app:broker", "list", "emails", env={"SHOP_REDIS_URL": redis_url})
    assert listed.returncode == 0 and "remind" in listed.stdout
    assert cli("shop_app", "list", "emails", env=env, url=False, cwd=tmp_path).returncode == 0

    assert_one_line_error(
        cli("builtin_app", "stats", env=env, url=False), 2, "dramatiq.brokers.redis.RedisBroker, not a"
    )
    assert_one_line_error(cli("shop_app:nope", "stats", env=env, url=False), 2, "has no attribute 'nope'")
    assert_one_line_error(cli("shop_app", "--url", redis_url, "stats", env=env, url=False), 2, "not both")
