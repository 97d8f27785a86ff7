"""Unknown actors wait for a worker that knows them (issue 58): a worker that gets a message
for an actor its process has not declared puts it back on the server, a second later, for
another worker; after ``unknown_actor_grace`` it is dead-lettered with a reason that names
the actor. On a real server, with in-process Workers and with ``dramatiq`` worker processes
replaced one at a time as in a rolling deploy."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import dramatiq
import pytest
import redis
from dramatiq import Worker
from dramatiq.middleware import default_middleware

from dramatiq_redisson import RedissonBroker
from dramatiq_redisson._format import last_error
from dramatiq_redisson._unknown_actors import PUT_BACK_DELAY_MS, REASON_OPTION, SINCE_OPTION
from dramatiq_redisson.metrics import make_registry
from tests.cli.test_cli import cli_runner, ok_json
from tests.helpers import record, records, server_ms, wait_for

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def new_broker(redis_url: str, make_broker: Callable[..., Any]) -> RedissonBroker:
    """A second broker on the same keys: the new release, which declares ``roll_new``."""
    return make_broker(url=redis_url, middleware=[m() for m in default_middleware])  # type: ignore[no-any-return]


@pytest.fixture
def roll_new(new_broker: RedissonBroker, redis_client: redis.Redis) -> dramatiq.Actor[[int], None]:
    """The actor the new release adds, declared on :func:`new_broker` only."""

    @dramatiq.actor(broker=new_broker, actor_name="roll_new", max_retries=3)
    def roll_new(i: int) -> None:
        record(redis_client, i=i)

    return roll_new


def unknown_count(broker: RedissonBroker, queue_name: str = "default") -> int:
    return broker.stats(queue_name)["queues"][queue_name]["unknown_actor"]


@pytest.fixture
def old_worker(broker: RedissonBroker, stamp: dramatiq.Actor[[int | None], None]) -> Iterator[Worker]:
    """A Worker of the old release: its broker declares ``stamp`` on the queue, not ``roll_new``."""
    worker = Worker(broker, worker_timeout=100, worker_threads=2)
    worker.start()
    yield worker
    worker.stop()


def test_a_worker_without_the_actor_puts_its_message_back_and_another_that_has_it_runs_it(
    broker: RedissonBroker,
    new_broker: RedissonBroker,
    roll_new: dramatiq.Actor[[int], None],
    old_worker: Worker,
    redis_client: redis.Redis,
) -> None:
    # Given a message for roll_new, which only the new release declares
    message = roll_new.send(1)
    # When only the old release's worker runs: it puts the message back, a second later each time
    assert wait_for(lambda: unknown_count(broker) >= 2, timeout=10)
    # Then it neither ran nor died, and it is scheduled again with its message id and options
    assert records(redis_client) == []
    assert broker.stats()["queues"]["default"]["dead"] == 0
    found = broker.delayed_queue("default").get(message.message_id)
    if found is None:  # (between its move and its next put-back)
        assert wait_for(lambda: broker.delayed_queue("default").get(message.message_id) is not None, timeout=3)
        found = broker.delayed_queue("default").get(message.message_id)
    assert found is not None
    due_ms, scheduled = found
    assert scheduled.args == (1,) and scheduled.actor_name == "roll_new"
    assert due_ms - server_ms(redis_client) <= PUT_BACK_DELAY_MS
    since = scheduled.options[SINCE_OPTION]
    assert 0 < server_ms(redis_client) - since < 10_000
    # (no retry is counted: Retries never saw it)
    assert "retries" not in scheduled.options
    history = broker.history("default")["queues"]["default"]["minutes"][-1]
    assert (history["processed"], history["failed"], history["retried"]) == (0, 0, 0)

    # When a worker of the new release starts
    started = server_ms(redis_client)
    new_worker = Worker(new_broker, worker_timeout=100, worker_threads=2)
    new_worker.start()
    try:
        assert wait_for(lambda: len(records(redis_client)) >= 1, timeout=10)
        time.sleep(0.5)  # a duplicate would show by now
    finally:
        new_worker.stop()
    # Then it runs the message once, soon
    runs = records(redis_client)
    assert [r["i"] for r in runs] == [1]
    waited_ms = runs[0]["at_ms"] - started
    print(f"roll_new started {waited_ms} ms after the new worker started")
    assert waited_ms < 3 * PUT_BACK_DELAY_MS
    assert broker.stats()["queues"]["default"]["dead"] == 0


def test_put_backs_count_no_retry_and_the_first_time_is_kept(
    broker: RedissonBroker,
    roll_new: dramatiq.Actor[[int], None],
    old_worker: Worker,
) -> None:
    # Given a message of roll_new that failed once already on a worker that knows it
    message = roll_new.send_with_options(args=(1,), retries=1, traceback="Traceback\nValueError: x")
    # When the old worker puts it back three times
    assert wait_for(lambda: unknown_count(broker) >= 3, timeout=10)
    assert wait_for(lambda: broker.delayed_queue("default").get(message.message_id) is not None, timeout=3)
    found = broker.delayed_queue("default").get(message.message_id)
    assert found is not None
    # Then its retries and options are as sent, and the time of its first put-back is kept
    options = found[1].options
    assert options["retries"] == 1 and options["traceback"] == "Traceback\nValueError: x"
    assert options[SINCE_OPTION] <= found[0] - 2 * PUT_BACK_DELAY_MS


def test_after_the_grace_the_message_is_dead_lettered_with_a_reason_that_names_the_actor(
    broker: RedissonBroker,
    roll_new: dramatiq.Actor[[int], None],
    old_worker: Worker,
    redis_client: redis.Redis,
) -> None:
    # Given a grace of 1.5 s
    broker.unknown_actor_grace = 1500
    # When a message for roll_new reaches only the old release's worker
    message = roll_new.send(1)
    assert wait_for(lambda: broker.dead_letters("default").size() == 1, timeout=10)
    # Then it was put back until the grace was over, then dead-lettered with the reason
    assert unknown_count(broker) >= 1
    (_, dead), *_ = broker.dead_letters("default").read_all()
    assert dead.message_id == message.message_id and records(redis_client) == []
    reason = dead.options[REASON_OPTION]
    assert reason.startswith("no worker that got it knows actor 'roll_new' (waited ")
    # ... which the CLI and the dashboard show as its error
    assert last_error(dead) == f"ActorNotFound: {reason}"
    # ... and a requeue by hand gets the grace anew
    assert SINCE_OPTION not in dead.options


def test_a_grace_of_0_dead_letters_at_once_as_dramatiq_does(
    broker: RedissonBroker,
    roll_new: dramatiq.Actor[[int], None],
    old_worker: Worker,
) -> None:
    broker.unknown_actor_grace = 0
    roll_new.send(1)
    assert wait_for(lambda: broker.dead_letters("default").size() == 1, timeout=5)
    assert unknown_count(broker) == 0
    (_, dead), *_ = broker.dead_letters("default").read_all()
    assert "waited 0 s" in dead.options[REASON_OPTION]


def test_a_put_back_message_gives_its_concurrency_slot_back_and_keeps_its_lane(
    broker: RedissonBroker,
    new_broker: RedissonBroker,
    old_worker: Worker,
    redis_client: redis.Redis,
) -> None:
    # Given a queue with a concurrency limit, and a grouped message for an actor the old worker lacks
    broker.limits.set("default", concurrency=1)

    @dramatiq.actor(broker=new_broker, actor_name="roll_new", group_key="g")
    def grouped() -> None:
        record(redis_client, ran=True)

    message = grouped.send()
    # When the old worker puts it back twice
    assert wait_for(lambda: unknown_count(broker) >= 2, timeout=10)

    # Then, while it waits, the slot it held while fetched is free again, and it waits in its lane
    def waiting_with_no_slot_held() -> bool:
        waiting = broker.delayed_queue("default").get(message.message_id) is not None
        return waiting and broker.limits.get("default")["in_use"] == 0

    assert wait_for(waiting_with_no_slot_held, timeout=3)
    lane = redis_client.hget(broker.keys("default").lane_of, message.message_id)
    assert lane is not None and lane.endswith(b"67")  # "g" as hex


def test_on_a_sharded_queue_each_shard_puts_back_and_the_count_sums_the_shards(
    redis_url: str, redis_client: redis.Redis, make_broker: Callable[..., Any]
) -> None:
    # Given a queue over two shards, an old release's broker and a new one's
    def sharded() -> RedissonBroker:
        return make_broker(  # type: ignore[no-any-return]
            url=redis_url, middleware=[m() for m in default_middleware], shards={"default": 2}
        )

    old, new = sharded(), sharded()

    @dramatiq.actor(broker=old)
    def old_job() -> None: ...

    @dramatiq.actor(broker=new)
    def roll_new(i: int) -> None:
        record(redis_client, i=i)

    def stats() -> Any:
        return old.stats("default")["queues"]["default"]

    for i in range(4):  # (sends go to the shards in turn)
        roll_new.send(i)
    workers = [Worker(old, worker_timeout=100, worker_threads=2)]
    workers[0].start()
    try:
        # When only the old release's worker runs, then the new one's too
        assert wait_for(lambda: all(s["unknown_actor"] > 0 for s in stats()["shards"].values()), timeout=10)
        assert stats()["unknown_actor"] == sum(s["unknown_actor"] for s in stats()["shards"].values())
        assert records(redis_client) == []
        workers.append(Worker(new, worker_timeout=100, worker_threads=2))
        workers[1].start()
        # Then every message runs once, on the new one
        assert wait_for(lambda: len(records(redis_client)) == 4, timeout=10)
        time.sleep(0.5)
    finally:
        for worker in workers:
            worker.stop()
    assert sorted(r["i"] for r in records(redis_client)) == [0, 1, 2, 3]
    assert stats()["dead"] == 0


def test_a_consumer_iterated_by_other_code_than_a_worker_gets_every_message(
    broker: RedissonBroker, roll_new: dramatiq.Actor[[int], None]
) -> None:
    # Given a message for an actor the broker has not declared
    message = roll_new.send(1)
    # When code of its own iterates the broker's consumer (no Worker)
    consumer = broker.consume("default", prefetch=1, timeout=100)
    try:
        got = next((m for m in (next(consumer) for _ in range(50)) if m is not None), None)
    finally:
        consumer.close()
    # Then it gets the message, as before
    assert got is not None and got.message_id == message.message_id
    assert unknown_count(broker) == 0


def test_a_fleet_that_knows_every_actor_pays_nothing(
    broker: RedissonBroker,
    stamp: dramatiq.Actor[[int | None], None],
    redis_client: redis.Redis,
    worker: Worker,
) -> None:
    # When known messages run (immediate and delayed)
    for i in range(20):
        stamp.send(i)
    stamp.send_with_options(args=(99,), delay=200)
    assert wait_for(lambda: len(records(redis_client)) == 21, timeout=10)
    # Then each ran once, nothing was put back (the count's key, which the put-back's
    # HINCRBY writes, was never made) and nothing was counted. (Not the server's
    # commandstats: the session's server is shared with what earlier tests left running.)
    assert sorted(r["i"] for r in records(redis_client)) == [*range(20), 99]
    assert redis_client.exists(broker.keys("default").counts) == 0
    assert unknown_count(broker) == 0


def test_the_count_is_in_stats_json_and_the_metrics(
    broker: RedissonBroker,
    roll_new: dramatiq.Actor[[int], None],
    old_worker: Worker,
    redis_url: str,
) -> None:
    from prometheus_client import generate_latest

    roll_new.send(1)
    assert wait_for(lambda: unknown_count(broker) >= 1, timeout=10)
    count = unknown_count(broker)
    exposition = generate_latest(make_registry(broker, queues=["default"])).decode()
    line = next(x for x in exposition.splitlines() if x.startswith("dramatiq_redisson_unknown_actor_put_backs_total"))
    assert line.startswith('dramatiq_redisson_unknown_actor_put_backs_total{queue_name="default"}')
    assert float(line.split()[-1]) >= count
    document = ok_json(cli_runner(redis_url)("stats", "--json"))
    assert document["queues"]["default"]["unknown_actor"] >= count


# -- a rolling deploy: `dramatiq` worker processes replaced one at a time -----------------

#: Where the app's worker processes say they run (tests/unknown_actors_app.py: importing it
#: here would build its broker).
BOOTED = "test:booted"

#: The producer's rate (messages per second, half of them for each actor) and how long it sends (s).
RATE, SEND_S = 40, 8.0


@pytest.mark.slow
def test_a_rolling_deploy_dead_letters_nothing_loses_nothing_and_starts_the_new_actor_at_once(
    broker: RedissonBroker, redis_url: str, redis_client: redis.Redis, tmp_path: Path
) -> None:
    # Given two worker commands of the old release (2 threads each), which lack roll_new
    fleet = Fleet(redis_url, redis_client, tmp_path)
    try:
        old = [fleet.start("old"), fleet.start("old")]
        fleet.wait_booted("old", 2)
        # When a producer sends 50 ms jobs of old_job and roll_new at 40/s for 8 s
        sent: list[tuple[str, str, int]] = []
        producer = threading.Thread(target=_produce, args=(broker, redis_url, sent), daemon=True)
        producer.start()
        time.sleep(1.5)
        # ... and the processes are replaced by the new release's, one at a time
        fleet.start("new")
        ready_ms = fleet.wait_booted("new", 1)
        fleet.stop(old[0])
        fleet.start("new")
        fleet.wait_booted("new", 2)
        fleet.stop(old[1])
        producer.join()
        ids = {message_id for message_id, _, _ in sent}
        assert wait_for(lambda: {r["id"] for r in records(redis_client)} >= ids, timeout=30), fleet.logs()
        time.sleep(0.5)  # a duplicate would show by now
    finally:
        fleet.stop_all()
    runs = records(redis_client)
    # Then nothing was dead-lettered, nothing lost, nothing run twice
    stats = broker.stats("default")["queues"]["default"]
    assert stats["dead"] == 0
    assert Counter(r["id"] for r in runs) == Counter(ids)
    # ... every roll_new ran on the new release, and some were put back by the old one
    started = {r["id"]: r for r in runs}
    new_ones = [(message_id, sent_ms) for message_id, actor, sent_ms in sent if actor == "roll_new"]
    assert all(started[message_id]["release"] == "new" for message_id, _ in new_ones)
    assert stats["unknown_actor"] > 0
    # ... and roll_new started within a second of the first new process being ready
    first_ms = min(started[message_id]["at_ms"] for message_id, _ in new_ones) - ready_ms
    waits = sorted(started[message_id]["at_ms"] - max(sent_ms, ready_ms) for message_id, sent_ms in new_ones)
    within_1_s = sum(wait <= 1000 for wait in waits)
    print(
        f"\nroll_new: first start {first_ms} ms after the first new process was ready; wait per message "
        f"(from max(sent, ready)) p50 {waits[len(waits) // 2]} ms, max {waits[-1]} ms, {within_1_s} of "
        f"{len(waits)} within 1 s; {stats['unknown_actor']} put-backs"
    )
    assert first_ms <= 2 * PUT_BACK_DELAY_MS


def _produce(broker: RedissonBroker, redis_url: str, sent: list[tuple[str, str, int]]) -> None:
    """Send old_job and roll_new messages in turn at :data:`RATE` for :data:`SEND_S`,
    noting each one's id, actor and send time (the server's clock)."""
    client = redis.Redis.from_url(redis_url)
    began = time.monotonic()
    try:
        for n in range(int(RATE * SEND_S)):
            time.sleep(max(0.0, began + n / RATE - time.monotonic()))
            actor = "roll_new" if n % 2 else "old_job"
            message = broker.enqueue(
                dramatiq.Message(queue_name="default", actor_name=actor, args=(), kwargs={}, options={})
            )
            sent.append((message.message_id, actor, server_ms(client)))
    finally:
        client.close()


class Fleet:
    """``dramatiq tests.unknown_actors_app`` commands of either release (1 process, 2
    threads each), their output in ``logs``."""

    def __init__(self, redis_url: str, client: redis.Redis, logs: Path) -> None:
        self.env = {**os.environ, "REDIS_URL": redis_url, "PYTHONPATH": str(ROOT), "JOB_S": "0.05"}
        self.client = client
        self.dir = logs
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, release: str) -> subprocess.Popen[bytes]:
        command = [sys.executable, "-m", "dramatiq", "tests.unknown_actors_app", "--processes", "1", "--threads", "2"]
        with open(self.dir / f"{release}-{len(self.procs)}.log", "wb") as out:
            proc = subprocess.Popen(
                command, env={**self.env, "APP_RELEASE": release}, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT
            )
        self.procs.append(proc)
        return proc

    def wait_booted(self, release: str, count: int) -> int:
        """Wait until ``count`` worker processes of ``release`` run; the server's time the
        last of them said so."""

        def booted() -> list[int]:
            entries = [json.loads(e) for e in self.client.lrange(BOOTED, 0, -1)]
            return [e["at_ms"] for e in entries if e["release"] == release]

        assert wait_for(lambda: len(booted()) >= count, timeout=30), self.logs()
        return sorted(booted())[count - 1]

    def stop(self, proc: subprocess.Popen[bytes]) -> None:
        """Stop one command as a deploy does: SIGTERM, then wait (its jobs finish)."""
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise AssertionError(f"a worker command did not stop on SIGTERM\n{self.logs()}") from None

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                self.stop(proc)

    def logs(self) -> str:
        return "\n".join(
            f"--- {p.name}:\n{p.read_text(errors='replace')[-3000:]}" for p in sorted(self.dir.glob("*.log"))
        )
