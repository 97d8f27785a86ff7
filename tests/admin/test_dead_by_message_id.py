"""Dead letters addressed by the Dramatiq message id as well as by their redis id: the API
(``DeadLetters.find``/``get``/``requeue``/``remove``), the command line (``dead show``,
``dead requeue``, ``dead purge`` as a subprocess, table and ``--json``) and the dashboard
(WSGI), on the real server; and the command line's error without Jinja2, said once."""

from __future__ import annotations

import html
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import dramatiq
import pytest
import redis
from dramatiq import Actor, Worker
from dramatiq.message import Message

from dramatiq_redisson import RedissonBroker
from dramatiq_redisson._errors import needs_extra
from dramatiq_redisson._ids import SORT_KEY_LENGTH, next_sort_key
from dramatiq_redisson.admin._dead_letters import SEARCH_LIMIT, SEARCH_STEP, AmbiguousDeadLetter, DeadLetters
from dramatiq_redisson.dashboard import make_app
from tests.cli.test_cli import cli_runner, ok_json
from tests.helpers import wait_for
from tests.wsgi_client import Client

UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}\Z")


# -- fixtures and helpers ------------------------------------------------------------------


@pytest.fixture
def cli(redis_url: str) -> Any:
    """Run ``python -m dramatiq_redisson ARGS`` with ``REDIS_URL`` set to the test server."""
    return cli_runner(redis_url)


def ok_json_status(result: subprocess.CompletedProcess[str], code: int) -> Any:
    """The JSON document of a command that exits with ``code``."""
    assert result.returncode == code, result.stderr
    return json.loads(result.stdout)


def one_line_error(result: subprocess.CompletedProcess[str], code: int) -> str:
    assert result.returncode == code, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    return lines[0]


@pytest.fixture
def failing(broker: RedissonBroker) -> tuple[Actor[..., None], Actor[..., None]]:
    """``explode`` dies at once; ``flaky`` is retried once without a delay (the retry gets
    a fresh uuid redis id), then dies."""

    @dramatiq.actor(max_retries=0)
    def explode(i: int) -> None:
        raise ValueError(f"boom {i}")

    @dramatiq.actor(max_retries=1, min_backoff=0)
    def flaky(i: int) -> None:
        raise RuntimeError(f"flaky {i}")

    return explode, flaky


@pytest.fixture
def died(
    broker: RedissonBroker, failing: tuple[Actor[..., None], Actor[..., None]]
) -> Iterator[dict[str, Message[Any]]]:
    """Three messages that died on a real worker (since stopped): ``now`` sent at once,
    ``later`` scheduled (1 ms), ``retried`` retried once first."""
    explode, flaky = failing
    sent = {
        "now": explode.send(1),
        "later": explode.send_with_options(args=(2,), delay=1),
        "retried": flaky.send(3),
    }
    worker = Worker(broker, worker_timeout=100, worker_threads=2)
    worker.start()
    try:
        assert wait_for(lambda: broker.dead_letters("default").size() == 3, timeout=15)
    finally:
        worker.stop()
    yield sent


def redis_ids(dl: DeadLetters) -> dict[str, str]:
    """Message id -> redis id of every dead letter."""
    return {m.message_id: str(m.options["redis_message_id"]) for _, m in dl.read_all()}


def bury(broker: RedissonBroker, message: Message[Any], redis_id: str, died_ms: int) -> str:
    """Write a dead letter as the broker's nack leaves it, under ``redis_id`` (on a queue the
    registry lists: the consumer that nacked it listed it)."""
    keys = broker.keys(message.queue_name)
    broker.client.sadd(keys.registry, keys.queue_name)
    broker.client.zadd(keys.xq, {redis_id: died_ms})
    broker.client.hset(keys.xq_msgs, redis_id, message.copy(options={"redis_message_id": redis_id}).encode())
    return redis_id


def ready_ids(broker: RedissonBroker) -> list[str]:
    return [m.decode() for m in cast("list[bytes]", broker.client.lrange(broker.keys("default").ready, 0, -1))]


@pytest.fixture
def twice(broker: RedissonBroker, failing: tuple[Actor[..., None], Actor[..., None]]) -> tuple[str, list[str]]:
    """One message id that names two dead letters (scheduled twice, dead twice): the id and
    their redis ids, newest first."""
    message = failing[0].message(7)
    now = int(broker.client.time()[0]) * 1000
    rids = [bury(broker, message, next_sort_key() + message.message_id, now - 5_000 + i) for i in range(2)]
    return message.message_id, rids[::-1]


# -- the API -----------------------------------------------------------------------------


def test_api_takes_the_message_id_and_the_redis_id_alike(broker: RedissonBroker, died: dict[str, Message[Any]]) -> None:
    dl = broker.dead_letters("default")
    rid = redis_ids(dl)
    now, later, retried = (died[k].message_id for k in ("now", "later", "retried"))
    # The redis ids: an immediate send's is its message id, a scheduled one's its sort key
    # and message id, a retry's (sent without a delay) a fresh uuid
    assert rid[now] == now
    assert rid[later].endswith(later) and len(rid[later]) == SORT_KEY_LENGTH + len(later)
    assert UUID.match(rid[retried]) and rid[retried] != retried
    for message_id in (now, later, retried):
        by_redis_id = dl.get(rid[message_id])
        assert by_redis_id is not None and by_redis_id[1].message_id == message_id
        assert dl.get(message_id) == by_redis_id
        assert dl.find(message_id) == dl.find(rid[message_id]) == [by_redis_id]
    assert dl.get(retried)[1].options["retries"] == 2  # type: ignore[index]
    assert "RuntimeError: flaky 3" in dl.get(retried)[1].options["traceback"]  # type: ignore[index]
    # An unknown id names nothing
    assert dl.get("nope") is None and dl.find("nope") == []
    assert dl.requeue("nope") is False and dl.remove("nope") is False
    # Requeue by message id: back on the ready queue under its redis id, gone from the dead
    assert dl.requeue(later) is True
    assert ready_ids(broker) == [rid[later]] and dl.get(later) is None and dl.requeue(later) is False
    # Remove by message id
    assert dl.remove(retried) is True
    assert dl.get(rid[retried]) is None and dl.remove(retried) is False
    assert list(redis_ids(dl)) == [now]


def test_a_message_id_that_names_several_dead_letters(broker: RedissonBroker, twice: tuple[str, list[str]]) -> None:
    message_id, rids = twice
    dl = broker.dead_letters("default")
    # find lists both, newest first; get and requeue refuse to pick one
    assert [m.options["redis_message_id"] for _, m in dl.find(message_id)] == rids
    with pytest.raises(AmbiguousDeadLetter) as raised:
        dl.get(message_id)
    assert raised.value.redis_message_ids == rids and raised.value.message_id == message_id
    assert str(raised.value) == (
        f"message id {message_id} names 2 dead letters on queue 'default' (redis ids {rids[0]}, {rids[1]}): "
        "give one of their redis ids"
    )
    with pytest.raises(AmbiguousDeadLetter):
        dl.requeue(message_id)
    assert dl.size() == 2 and ready_ids(broker) == []
    # A redis id names one
    assert dl.get(rids[1])[1].options["redis_message_id"] == rids[1]  # type: ignore[index]
    # remove deletes every dead letter of the message id
    assert dl.remove(message_id) is True and dl.size() == 0


def test_the_search_for_a_message_id_is_bounded_and_reads_little(
    broker: RedissonBroker, failing: tuple[Actor[..., None], Actor[..., None]], monkeypatch: pytest.MonkeyPatch
) -> None:
    explode = failing[0]
    now = int(broker.client.time()[0]) * 1000
    # Given the message's scheduled copy and a retry's copy (a uuid redis id) among the
    # oldest, under 2,500 newer dead letters of other messages (uuid redis ids, as
    # immediate sends have)
    target = explode.message(1)
    scheduled = bury(broker, target, next_sort_key() + target.message_id, now - 100_000)
    retry = bury(broker, target.copy(options={"retries": 1}), "0e9a2c1e-7f33-4d6b-9f0e-3b1f5f3f2a11", now - 99_999)
    pipe = broker.client.pipeline(transaction=False)
    keys = broker.keys("default")
    for i in range(2_500):
        other = explode.message(i)
        pipe.zadd(keys.xq, {other.message_id: now - 50_000 + i})
        pipe.hset(keys.xq_msgs, other.message_id, other.copy(options={"redis_message_id": other.message_id}).encode())
    pipe.execute()
    dl = broker.dead_letters("default")
    decoded: list[str] = []
    decode = DeadLetters._decode

    def counting(self: DeadLetters, redis_message_id: str, data: bytes) -> Message[Any] | None:
        decoded.append(redis_message_id)
        return decode(self, redis_message_id, data)

    monkeypatch.setattr(DeadLetters, "_decode", counting)
    # When it is looked for by message id, then both are found, across pages (newest
    # first), and only those two are decoded (the others' data holds no such id)
    assert 2_500 > 2 * SEARCH_STEP and SEARCH_LIMIT > 2_502
    found = dl.find(target.message_id)
    assert [m.options["redis_message_id"] for _, m in found] == [retry, scheduled]
    assert sorted(decoded) == sorted([retry, scheduled])
    # Beyond the bound it is not looked for; limit=None looks at every one
    assert dl.find(target.message_id, limit=2_500) == []
    assert len(dl.find(target.message_id, limit=None)) == 2
    with pytest.raises(ValueError, match="limit"):
        dl.find(target.message_id, limit=-1)


# -- the command line ----------------------------------------------------------------------


def test_cli_show_requeue_purge_by_message_id_and_redis_id(
    cli: Any, broker: RedissonBroker, died: dict[str, Message[Any]]
) -> None:
    dl = broker.dead_letters("default")
    rid = redis_ids(dl)
    now, later, retried = (died[k].message_id for k in ("now", "later", "retried"))

    # dead list: the message id first, then the redis id
    listed = cli("dead", "list", "default")
    assert listed.returncode == 0, listed.stderr
    assert re.search(r"^message id\s+redis id\s+died \(UTC\)\s+when\s+actor\s+retries", listed.stdout, re.M)
    assert re.search(rf"^{later}\s+{rid[later]}\s+\S+\s+.*ago\s+explode\s+1\s+ValueError: boom 2", listed.stdout, re.M)
    assert re.search(rf"^{retried}\s+{rid[retried]}\s+.*flaky\s+2\s+RuntimeError: flaky 3", listed.stdout, re.M)

    # dead show by message id and by redis id: the same dead letter
    shown = cli("dead", "show", "default", later)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.startswith(f"Dead letter {later} on 'default'\n")
    assert re.search(rf"^  redis id\s+{rid[later]}$", shown.stdout, re.M)
    assert re.search(rf"^  message id\s+{later}$", shown.stdout, re.M)
    assert "ValueError: boom 2" in shown.stdout
    for given in (later, rid[later]):
        document = ok_json(cli("dead", "show", "default", given, "--json"))
        assert (document["message_id"], document["found"], document["count"]) == (given, True, 1)
        assert document["message"]["redis_message_id"] == rid[later]
        assert document["message"]["message_id"] == later and document["messages"] == [document["message"]]
    document = ok_json(cli("dead", "show", "default", retried, "--json"))
    assert document["message"]["redis_message_id"] == rid[retried] and document["message"]["options"]["retries"] == 2
    assert one_line_error(cli("dead", "show", "default", "nope"), 1) == "no dead letter nope on queue 'default'"
    assert ok_json_status(cli("dead", "show", "default", "nope", "--json"), 1) == {
        "queue": "default",
        "message_id": "nope",
        "found": False,
    }

    # dead requeue by message id (table) and by redis id (--json)
    requeued = cli("dead", "requeue", "default", later, "nope")
    assert requeued.stdout == f"requeued {later} (redis id {rid[later]})\n"
    assert one_line_error(requeued, 1) == "no dead letter nope on queue 'default'"
    assert ready_ids(broker) == [rid[later]] and dl.get(later) is None
    document = ok_json(cli("dead", "requeue", "default", rid[retried], "--json"))
    assert document == {"queue": "default", "count": 1, "requeued": [rid[retried]], "not_found": [], "ambiguous": {}}
    assert ready_ids(broker) == [rid[later], rid[retried]]

    # dead purge by message id: asks first, counting what it found
    assert "refusing to delete 1 dead letter(s) of queue 'default'" in one_line_error(
        cli("dead", "purge", "default", now), 2
    )
    assert cli("dead", "purge", "default", now, "--yes").stdout == f"deleted {now}\n"
    assert dl.size() == 0
    assert (
        one_line_error(cli("dead", "purge", "default", now, "--yes"), 1) == f"no dead letter {now} on queue 'default'"
    )


def test_cli_with_a_message_id_that_names_several(
    cli: Any, broker: RedissonBroker, twice: tuple[str, list[str]]
) -> None:
    message_id, rids = twice
    # show lists them, newest first, and says how to name one
    shown = cli("dead", "show", "default", message_id)
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[0] == (
        f"Message id {message_id} names 2 dead letters on 'default', newest first; "
        "give a redis id to show, requeue or purge one:"
    )
    assert [line.split()[1] for line in lines if line.startswith(message_id)] == rids
    document = ok_json(cli("dead", "show", "default", message_id, "--json"))
    assert (document["count"], document["message"]) == (2, None)
    assert [m["redis_message_id"] for m in document["messages"]] == rids

    # requeue refuses (each would run the message again): nothing changes
    refused = cli("dead", "requeue", "default", message_id)
    assert refused.stdout == ""
    assert one_line_error(refused, 1) == (
        f"not requeued: message id {message_id} names 2 dead letters on queue 'default' "
        f"(redis ids, newest first: {rids[0]}, {rids[1]}); requeue one by its redis id"
    )
    refused = cli("dead", "requeue", "default", message_id, "--json")
    assert refused.returncode == 1
    assert ok_json_status(refused, 1) == {
        "queue": "default",
        "count": 0,
        "requeued": [],
        "not_found": [],
        "ambiguous": {message_id: rids},
    }
    assert broker.dead_letters("default").size() == 2 and ready_ids(broker) == []

    # one of them by its redis id
    assert cli("dead", "requeue", "default", rids[1]).stdout == f"requeued {rids[1]}\n"
    assert ready_ids(broker) == [rids[1]]

    # purge deletes every one the message id names, after asking
    data = cast("bytes", broker.client.hget(broker.keys("default").ready_msgs, rids[1]))
    bury(broker, Message.decode(data), rids[1], 0)  # it died again, long ago
    assert "refusing to delete 2 dead letter(s)" in one_line_error(cli("dead", "purge", "default", message_id), 2)
    document = ok_json(cli("dead", "purge", "default", message_id, "--yes", "--json"))
    assert document == {"queue": "default", "count": 2, "removed": rids, "not_found": []}
    assert broker.dead_letters("default").size() == 0


def test_cli_error_without_jinja2_says_it_once(cli: Any, redis_url: str, tmp_path: Path) -> None:
    env = {**os.environ, "REDIS_URL": redis_url}
    needs = f"the dashboard needs Jinja2 ({needs_extra('dashboard')})"
    # Jinja2 not installed
    missing = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; sys.modules['jinja2'] = None; from dramatiq_redisson.cli import main; sys.exit(main())",
            "dashboard",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (missing.returncode, missing.stdout) == (2, "")
    assert missing.stderr == f"dramatiq-redisson: error: {needs}\n"
    # Jinja2 there but broken: why, once
    (tmp_path / "jinja2.py").write_text("raise ImportError(\"cannot import name 'Markup' from 'markupsafe'\")\n")
    broken = subprocess.run(
        [sys.executable, "-m", "dramatiq_redisson", "dashboard"],
        env={**env, "PYTHONPATH": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert broken.returncode == 2
    assert broken.stderr == f"dramatiq-redisson: error: {needs}: cannot import name 'Markup' from 'markupsafe'\n"


# -- the dashboard ---------------------------------------------------------------------------


def test_dashboard_opens_and_acts_on_dead_letters_by_message_id(
    broker: RedissonBroker, died: dict[str, Message[Any]], redis_client: redis.Redis
) -> None:
    client = Client(make_app(broker))
    dl = broker.dead_letters("default")
    rid = redis_ids(dl)
    later, retried = died["later"].message_id, died["retried"].message_id

    # The list: the message id first (linking to the dead letter), then the redis id
    listing = client.get("/queues/default/dead")
    assert listing.status == 200
    assert "<th>Message id</th><th>Redis id</th><th>Died (UTC)</th>" in listing.text
    row = re.search(rf'<tr data-id="{rid[later]}">(.*?)</tr>', listing.text, re.S)
    assert row, listing.text
    cells = dict(re.findall(r'data-field="([\w-]+)">(.*?)</td>', row.group(1), re.S))
    assert cells["message-id"] == f'<a href="/queues/default/dead/{rid[later]}">{later}</a>'
    assert cells["redis-id"] == rid[later]

    # A dead letter's page by its message id names both ids; its forms use the redis id
    for given in (later, rid[later]):
        page = client.get(f"/queues/default/dead/{given}")
        assert page.status == 200
        assert f'<dd class="mono" id="message-id">{later}</dd>' in page.text
        assert f'<dd class="mono" id="redis-id">{rid[later]}</dd>' in page.text
        assert f'action="/queues/default/dead/{rid[later]}/requeue"' in page.text
    assert client.get("/queues/default/dead/nope").status == 404

    # The find box: one found opens it, none found says so
    found = client.get(f"/queues/default/dead?id={retried}")
    assert found.status == 303 and found.location()[0] == f"/queues/default/dead/{rid[retried]}"
    nothing = client.get("/queues/default/dead?id=nope")
    assert nothing.status == 200 and 'id="empty"' in nothing.text
    assert "No dead letter nope: no redis id, nor a message id among the 3 dead letters." in re.sub(
        r"<[^>]+>", "", html.unescape(nothing.text)
    )

    # Requeue and delete by message id
    token = client.token("/queues/default/dead")
    done = client.post(f"/queues/default/dead/{later}/requeue", {"csrf": token})
    assert done.location()[1]["flash"] == f"Dead letter {later} put back on the ready queue."
    assert ready_ids(broker) == [rid[later]]
    done = client.post(f"/queues/default/dead/{retried}/delete", {"csrf": token})
    assert done.location()[1]["flash"] == f"Dead letter {retried} deleted."
    assert dl.get(rid[retried]) is None
    again = client.post(f"/queues/default/dead/{retried}/delete", {"csrf": token})
    assert again.location()[1]["flash"] == f"No dead letter {retried}: nothing done."


def test_dashboard_with_a_message_id_that_names_several(broker: RedissonBroker, twice: tuple[str, list[str]]) -> None:
    message_id, rids = twice
    client = Client(make_app(broker))
    # Its page lists them, to pick one
    opened = client.get(f"/queues/default/dead/{message_id}")
    assert opened.status == 303 and opened.location() == ("/queues/default/dead", {"id": message_id})
    listing = client.get(f"/queues/default/dead?id={message_id}")
    assert re.findall(r'<tr data-id="([^"]+)"', listing.text) == rids
    assert 'id="several"' in listing.text and 'id="all-requeue"' not in listing.text
    # Requeue by message id does nothing; delete deletes both
    token = client.token("/queues/default/dead")
    refused = client.post(f"/queues/default/dead/{message_id}/requeue", {"csrf": token})
    assert refused.location() == (
        "/queues/default/dead",
        {
            "id": message_id,
            "flash": f"Message id {message_id} names 2 dead letters: requeue one of them, nothing done.",
        },
    )
    assert broker.dead_letters("default").size() == 2 and ready_ids(broker) == []
    deleted = client.post(f"/queues/default/dead/{message_id}/delete", {"csrf": token})
    assert deleted.location()[1]["flash"] == f"2 dead letters of message id {message_id} deleted."
    assert broker.dead_letters("default").size() == 0
