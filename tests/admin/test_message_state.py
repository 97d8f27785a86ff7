"""A message's state by its message id (issue 58): ``broker.message_state`` on a real server
for each state (scheduled, ready, running with its progress, done, failed, dead, unknown),
with and without a queue named, the done records on and off (an ack without them writes
nothing), a sharded queue, the command line (``state``, a subprocess) and the dashboard's
message page."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import dramatiq
import pytest
import redis
from dramatiq import Actor, Worker
from dramatiq.middleware import default_middleware

from dramatiq_redisson import RedissonBroker, progress
from dramatiq_redisson.admin._message_state import STATES, MessageState
from dramatiq_redisson.dashboard import make_app
from tests.cli.test_cli import cli_runner
from tests.helpers import server_ms, wait_for
from tests.wsgi_client import Client

HOUR_MS = 3_600_000


@pytest.fixture
def cli(redis_url: str) -> Any:
    return cli_runner(redis_url)


@pytest.fixture
def jobs(broker: RedissonBroker) -> dict[str, Actor[..., Any]]:
    """Actors on queue "jobs": ``quick`` returns, ``doomed`` fails for good, ``flaky`` fails
    and is retried an hour later."""

    @dramatiq.actor(queue_name="jobs", max_retries=0)
    def quick(n: int) -> None: ...

    @dramatiq.actor(queue_name="jobs", max_retries=0)
    def doomed(n: int) -> None:
        raise ValueError(f"doomed {n}")

    @dramatiq.actor(queue_name="jobs", max_retries=3, min_backoff=HOUR_MS, max_backoff=HOUR_MS)
    def flaky(n: int) -> None:
        raise RuntimeError(f"flaky {n}")

    return {"quick": quick, "doomed": doomed, "flaky": flaky}


@pytest.fixture
def run(broker: RedissonBroker) -> Iterator[Any]:
    """``run(pending)``: a worker until ``pending()`` is true (then stopped)."""
    workers: list[Worker] = []

    def until(done: Any, timeout: float = 15) -> None:
        worker = Worker(broker, worker_timeout=100, worker_threads=2)
        workers.append(worker)
        worker.start()
        try:
            assert wait_for(done, timeout=timeout)
        finally:
            worker.stop()

    yield until
    for worker in workers:
        worker.stop()


def _transfer(broker: RedissonBroker, queue_name: str = "jobs") -> int:
    """Move what is due to the ready queue, as a consumer's timer does (nobody fetches)."""
    scripts = broker.redisson_scripts
    keys = broker.keys(queue_name)
    return scripts.transfer(keys, limit=1000, trim_budget=0, compact_step=0, compact_slack=0).moved


def _state(broker: RedissonBroker, message_id: str, queue_name: str | None = None) -> str:
    return broker.message_state(message_id, queue_name)["state"]


# -- each state ----------------------------------------------------------------------------


def test_a_scheduled_message_has_its_due_time_and_sent_time(
    broker: RedissonBroker, redis_client: redis.Redis, jobs: dict[str, Actor[..., Any]]
) -> None:
    before = server_ms(redis_client)
    sent = jobs["quick"].send_with_options(args=(1,), delay=HOUR_MS)
    for queue_name in ("jobs", None):
        found = broker.message_state(sent.message_id, queue_name)
        assert (found["state"], found["queue"], found["actor"], found["retries"]) == ("scheduled", "jobs", "quick", 0)
        assert found["due_ms"] is not None and before + HOUR_MS <= found["due_ms"] <= server_ms(redis_client) + HOUR_MS
        assert found["sent_ms"] == sent.message_timestamp
        assert found["redis_message_id"] == sent.options["redis_message_id"]
        assert found["message"] is not None and found["message"].args == (1,)
        assert found["started_ms"] is found["finished_ms"] is None


def test_an_immediate_message_waiting_is_ready(broker: RedissonBroker, jobs: dict[str, Actor[..., Any]]) -> None:
    sent = jobs["quick"].send(2)
    found = broker.message_state(sent.message_id)
    assert (found["state"], found["queue"], found["redis_message_id"]) == ("ready", "jobs", sent.message_id)
    assert found["due_ms"] is None and found["complete"]


def test_a_delayed_message_moved_to_the_ready_queue_is_found_by_a_search(
    broker: RedissonBroker, jobs: dict[str, Actor[..., Any]]
) -> None:
    # Given a delayed message moved to the ready queue behind 50 immediate ones
    sent = jobs["quick"].send_with_options(args=(3,), delay=1)
    broker.enqueue_many([jobs["quick"].message(n) for n in range(50)])
    assert wait_for(lambda: _transfer(broker) == 1, timeout=5)
    # Then it is ready, under its member, with a queue named or not
    for queue_name in ("jobs", None):
        found = broker.message_state(sent.message_id, queue_name)
        assert (found["state"], found["redis_message_id"]) == ("ready", sent.options["redis_message_id"])


def test_a_running_message_has_its_worker_start_and_progress(
    broker: RedissonBroker, redis_client: redis.Redis, jobs: dict[str, Actor[..., Any]]
) -> None:
    started, release = threading.Event(), threading.Event()

    @dramatiq.actor(queue_name="jobs", max_retries=0)
    def long_one() -> None:
        progress.report(0.4, "4 of 10 rows")
        started.set()
        release.wait(10)

    sent = long_one.send_with_options(delay=1)  # moved and handed off: found by the search
    worker = Worker(broker, worker_timeout=100, worker_threads=1)
    worker.start()
    try:
        assert started.wait(10)
        found = broker.message_state(sent.message_id)
        assert (found["state"], found["queue"], found["worker_id"]) == ("running", "jobs", broker.broker_id)
        assert found["started_ms"] is not None and found["started_ms"] <= server_ms(redis_client)
        assert (found["progress"], found["note"]) == (0.4, "4 of 10 rows")
        assert found["pid"] is not None and found["redis_message_id"] == sent.options["redis_message_id"]
    finally:
        release.set()
        worker.stop()


def test_a_failed_message_with_a_retry_scheduled_is_failed_then_dead_once_retries_end(
    broker: RedissonBroker, jobs: dict[str, Actor[..., Any]], run: Any
) -> None:
    flaky, doomed = jobs["flaky"].send(4), jobs["doomed"].send(5)
    run(lambda: _state(broker, flaky.message_id) == "failed" and _state(broker, doomed.message_id) == "dead")
    retry = broker.message_state(flaky.message_id)
    assert retry["retries"] == 1 and retry["due_ms"] is not None and retry["due_ms"] > retry["time_ms"] + HOUR_MS / 4
    assert retry["message"] is not None and "flaky 4" in retry["message"].options["traceback"]
    dead = broker.message_state(doomed.message_id, "jobs")
    assert dead["finished_ms"] is not None and dead["finished_ms"] <= dead["time_ms"]
    assert dead["retries"] == 1 and dead["redis_message_id"] == doomed.message_id  # (failed once)


def test_a_moved_message_that_died_is_dead(broker: RedissonBroker, jobs: dict[str, Actor[..., Any]], run: Any) -> None:
    sent = jobs["doomed"].send_with_options(args=(6,), delay=1)
    run(lambda: broker.dead_letters("jobs").size() == 1)
    found = broker.message_state(sent.message_id)
    assert (found["state"], found["redis_message_id"]) == ("dead", sent.options["redis_message_id"])


def test_an_id_nothing_holds_is_unknown_and_an_unknown_queue_is_refused(
    broker: RedissonBroker, jobs: dict[str, Actor[..., Any]]
) -> None:
    jobs["quick"].send(7)
    found = broker.message_state(str(uuid.uuid4()))
    assert (found["state"], found["queue"], found["message"], found["complete"]) == ("unknown", None, None, True)
    with pytest.raises(ValueError, match="unknown queue 'nope'"):
        broker.message_state(found["message_id"], "nope")
    with pytest.raises(ValueError, match="message_id"):
        broker.message_state("")
    with pytest.raises(ValueError, match="search must be a non-negative int"):
        broker.message_state(found["message_id"], search=-1)
    assert set(STATES) == {"scheduled", "ready", "running", "done", "failed", "dead", "unknown"}


# -- done records --------------------------------------------------------------------------


def test_a_processed_message_is_done_with_done_retention_on(
    broker: RedissonBroker, redis_client: redis.Redis, jobs: dict[str, Actor[..., Any]], run: Any
) -> None:
    broker.done_retention = 60_000
    now, later = jobs["quick"].send(8), jobs["quick"].send_with_options(args=(9,), delay=1)
    before = server_ms(redis_client)
    run(lambda: _state(broker, now.message_id) == "done" and _state(broker, later.message_id) == "done")
    for sent in (now, later):
        found = broker.message_state(sent.message_id)
        assert found["queue"] == "jobs" and found["finished_ms"] is not None
        assert before <= found["finished_ms"] <= found["time_ms"]
    assert redis_client.zcard(broker.keys("jobs").done) == 2


def test_done_retention_off_writes_nothing_and_a_processed_message_is_unknown(
    broker: RedissonBroker, redis_client: redis.Redis, jobs: dict[str, Actor[..., Any]], run: Any
) -> None:
    assert broker.done_retention == 0
    sent = jobs["quick"].send(10)
    run(lambda: broker.pending("jobs") == 0)
    assert _state(broker, sent.message_id) == "unknown"
    assert not redis_client.exists(broker.keys("jobs").done)


def test_done_records_older_than_the_retention_are_dropped(
    broker: RedissonBroker, redis_client: redis.Redis, jobs: dict[str, Actor[..., Any]], run: Any
) -> None:
    # Given a retention of 300 ms and a message done
    broker.done_retention = 300
    first = jobs["quick"].send(11)
    run(lambda: _state(broker, first.message_id) == "done")
    # When another is done more than the retention and a trim interval later
    threading.Event().wait(1.2)
    second = jobs["quick"].send(12)
    run(lambda: _state(broker, second.message_id) == "done")
    # Then the first one's record is gone (its ack trimmed it), and the key expires by itself
    assert _state(broker, first.message_id) == "unknown"
    assert 0 < redis_client.pttl(broker.keys("jobs").done) <= 300 + 60_000


def test_done_retention_is_checked_like_the_other_settings(make_broker: Any, redis_url: str) -> None:
    with pytest.raises(ValueError, match="done_retention must be a non-negative int"):
        make_broker(url=redis_url, done_retention=-1)
    broker = make_broker(url=redis_url, done_retention=5_000)
    assert broker.done_retention == broker.settings.done_retention == 5_000


# -- a sharded queue -----------------------------------------------------------------------


def test_a_message_on_a_sharded_queue_is_found_on_its_shard(
    make_broker: Any, redis_url: str, redis_client: redis.Redis
) -> None:
    broker = make_broker(url=redis_url, shards={"wide": 3}, middleware=[m() for m in default_middleware])

    @dramatiq.actor(queue_name="wide", broker=broker, max_retries=0)
    def spread(n: int) -> None: ...

    try:
        sent = [spread.send(n) for n in range(6)] + [spread.send_with_options(args=(9,), delay=HOUR_MS)]
        for message in sent[:6]:
            assert (broker.message_state(message.message_id, "wide")["queue"], _state(broker, message.message_id)) == (
                "wide",
                "ready",
            )
        assert _state(broker, sent[6].message_id, "wide") == "scheduled"
    finally:
        broker.flush_all()


# -- the command line and the dashboard ----------------------------------------------------


def test_cli_state_prints_the_state_as_a_table_and_as_json(
    broker: RedissonBroker, cli: Any, jobs: dict[str, Actor[..., Any]]
) -> None:
    sent = jobs["quick"].send_with_options(args=(13,), delay=HOUR_MS)
    table = cli("state", sent.message_id)
    assert table.returncode == 0, table.stderr
    assert f"Message {sent.message_id} on 'jobs': scheduled" in table.stdout
    assert "due" in table.stdout and "quick" in table.stdout and "13" in table.stdout
    doc = json.loads(cli("state", sent.message_id, "--queue", "jobs", "--json").stdout)
    assert (doc["state"], doc["queue"], doc["actor"], doc["retries"]) == ("scheduled", "jobs", "quick", 0)
    assert doc["due"].endswith("Z") and doc["message"]["args"] == [13] and doc["finished"] is None


def test_cli_state_of_an_unknown_id_exits_1_and_of_an_unknown_queue_exits_2(
    broker: RedissonBroker, cli: Any, jobs: dict[str, Actor[..., Any]]
) -> None:
    jobs["quick"].send(14)
    missing = cli("state", "no-such-id", "--json")
    assert missing.returncode == 1 and json.loads(missing.stdout)["state"] == "unknown"
    assert "not found" in cli("state", "no-such-id").stdout
    refused = cli("state", "no-such-id", "--queue", "nope")
    assert refused.returncode == 2 and "unknown queue 'nope'" in refused.stderr
    assert "Traceback" not in refused.stderr


def test_dashboard_message_page_shows_the_state_of_any_message(
    broker: RedissonBroker, jobs: dict[str, Actor[..., Any]]
) -> None:
    client = Client(make_app(broker))
    scheduled = jobs["quick"].send_with_options(args=(15,), delay=HOUR_MS)
    ready = jobs["quick"].send(16)
    page = client.get(f"/queues/jobs/messages/{scheduled.message_id}")
    assert page.status == 200 and 'data-state="scheduled"' in page.text and 'id="cancel"' in page.text
    page = client.get(f"/queues/jobs/messages/{ready.message_id}")
    assert page.status == 200 and 'data-state="ready"' in page.text and 'id="cancel"' not in page.text
    assert client.get("/queues/jobs/messages/no-such-id").status == 404


def test_the_state_is_a_message_state(broker: RedissonBroker, jobs: dict[str, Actor[..., Any]]) -> None:
    found: MessageState = broker.message_state(jobs["quick"].send(17).message_id)
    assert set(found) == set(MessageState.__annotations__)


def test_dashboard_message_page_of_a_done_a_dead_and_a_failed_message(
    broker: RedissonBroker, jobs: dict[str, Actor[..., Any]], run: Any
) -> None:
    broker.done_retention = 60_000
    done, dead, failed = jobs["quick"].send(18), jobs["doomed"].send(19), jobs["flaky"].send(20)
    run(lambda: [_state(broker, m.message_id) for m in (done, dead, failed)] == ["done", "dead", "failed"])
    client = Client(make_app(broker))
    page = client.get(f"/queues/jobs/messages/{done.message_id}")
    assert page.status == 200 and 'data-state="done"' in page.text and 'id="finished"' in page.text
    page = client.get(f"/queues/jobs/messages/{dead.message_id}")
    assert 'data-state="dead"' in page.text and f"/queues/jobs/dead/{dead.message_id}" in page.text
    assert "ValueError: doomed 19" in page.text and 'id="cancel"' not in page.text
    page = client.get(f"/queues/jobs/messages/{failed.message_id}")
    assert 'data-state="failed"' in page.text and "scheduled as a retry" in page.text and 'id="cancel"' in page.text
