"""``dramatiq_redisson.progress`` (issue 58): progress reports, checkpoints that a later run
resumes from, ``should_stop()`` and ``Interrupted``, on the real server: with Workers of
this process, and with the ``dramatiq`` command's worker processes stopped by SIGTERM as a
deploy stops them."""

from __future__ import annotations

import html
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import dramatiq
import pytest
import redis
from dramatiq import Worker
from dramatiq.middleware import CurrentMessage, default_middleware
from redis.cluster import key_slot

from dramatiq_redisson import RedissonBroker, progress
from dramatiq_redisson import _progress as progress_internals
from dramatiq_redisson.dashboard import make_app
from tests.cli.test_cli import cli_runner, ok_json
from tests.cli.test_live_cli import plain_table
from tests.harness.topology import Cluster
from tests.helpers import records, server_ms, wait_for
from tests.wsgi_client import Client

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def start_worker(broker: RedissonBroker) -> Iterator[Callable[..., Worker]]:
    """Start Workers of ``broker`` (one thread each unless told); each is stopped at
    teardown (stopping one the test stopped again does no harm)."""
    started: list[Worker] = []

    def start(**options: Any) -> Worker:
        worker = Worker(broker, **{"worker_timeout": 100, "worker_threads": 1, **options})
        worker.start()
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.stop()


def kept(client: redis.Redis, broker: RedissonBroker, queue: str = "default") -> tuple[int, int]:
    """How many progress reports and checkpoints ``queue`` keeps."""
    keys = broker.keys(queue)
    return int(client.hlen(keys.progress)), int(client.hlen(keys.checkpoints))


# -- report ------------------------------------------------------------------------------------


def test_report_shows_in_running_the_cli_and_the_dashboard_until_the_message_succeeds(
    broker: RedissonBroker, redis_client: redis.Redis, redis_url: str, start_worker: Callable[..., Worker]
) -> None:
    # Given an export that reports a quarter done and waits, beside a message that reports nothing
    release = threading.Event()

    @dramatiq.actor(queue_name="slow", max_retries=0)
    def export() -> None:
        progress.report(0.25, "<b>25</b> of 100 | rows")
        release.wait(20)

    @dramatiq.actor(queue_name="slow", max_retries=0)
    def quiet() -> None:
        release.wait(20)

    start_worker(worker_threads=2)
    message = export.send()
    other = quiet.send()

    # Then running() shows its fraction, note and when it reported; the other shows none
    assert wait_for(lambda: len(broker.running("slow")) == 2 and kept(redis_client, broker, "slow")[0] == 1)
    by_id = {m["message_id"]: m for m in broker.running("slow")}
    entry, silent = by_id[message.message_id], by_id[other.message_id]
    assert (entry["progress"], entry["note"]) == (0.25, "<b>25</b> of 100 | rows")
    assert entry["reported_ms"] is not None and abs(entry["reported_ms"] - server_ms(redis_client)) < 10_000
    assert (silent["progress"], silent["note"], silent["reported_ms"]) == (None, None, None)

    # And the CLI's running command, as JSON and as a table
    cli = cli_runner(redis_url)
    [doc] = [m for m in ok_json(cli("running", "slow", "--json"))["messages"] if m["message_id"] == message.message_id]
    assert (doc["progress"], doc["note"]) == (0.25, "<b>25</b> of 100 | rows") and doc["reported"].endswith("Z")
    result = cli("--plain", "running", "slow")
    assert result.returncode == 0, result.stderr
    rows = {row["message id"]: row for row in plain_table(result.stdout, "message id")}
    assert (rows[message.message_id]["progress"], rows[message.message_id]["note"]) == (
        "25%",
        "<b>25</b> of 100 | rows",
    )
    assert (rows[other.message_id]["progress"], rows[other.message_id]["note"]) == ("-", "-")

    # And the dashboard's Running page, the note escaped
    page = Client(make_app(broker)).get("/running?queue=slow")
    assert page.status == 200
    assert 'data-field="progress" data-value="0.25"' in page.text and '<progress max="100" value="25">' in page.text
    assert html.escape("<b>25</b> of 100 | rows") in page.text and "<b>25</b>" not in page.text

    # When both succeed, then the report is dropped
    release.set()
    assert wait_for(lambda: broker.running("slow") == [])
    assert wait_for(lambda: kept(redis_client, broker, "slow") == (0, 0))


def test_bad_values_are_refused_and_write_nothing(
    broker: RedissonBroker, redis_client: redis.Redis, start_worker: Callable[..., Worker]
) -> None:
    # Given an actor that calls report and checkpoint with bad values, then with the largest good ones
    refused: list[str] = []
    seen: list[tuple[int, int]] = []
    bad_calls: list[Callable[[], None]] = [
        lambda: progress.report(1.5),
        lambda: progress.report(-0.01),
        lambda: progress.report(float("nan")),
        lambda: progress.report(True),
        lambda: progress.report("0.5"),  # type: ignore[arg-type]
        lambda: progress.report(0.5, "x" * (progress.MAX_NOTE_LENGTH + 1)),
        lambda: progress.report(0.5, 42),  # type: ignore[arg-type]
        lambda: progress.checkpoint({"ids": {1, 2}}),
        lambda: progress.checkpoint({"x": float("inf")}),
        lambda: progress.checkpoint("x" * (progress.MAX_CHECKPOINT_BYTES - 1)),  # 2 bytes of quotes more
    ]

    @dramatiq.actor(max_retries=0)
    def job() -> None:
        for call in bad_calls:
            try:
                call()
            except ValueError as e:
                refused.append(str(e))
        seen.append(kept(redis_client, broker))
        progress.report(1, "x" * progress.MAX_NOTE_LENGTH)
        progress.checkpoint("x" * (progress.MAX_CHECKPOINT_BYTES - 2))
        seen.append(kept(redis_client, broker))

    start_worker()
    job.send()
    broker.join("default", timeout=10_000)

    # Then each bad call was a ValueError that says what is wrong, and wrote nothing
    assert len(refused) == len(bad_calls), refused
    assert "from 0 to 1, got 1.5" in refused[0] and "got True" in refused[3]
    assert f"{progress.MAX_NOTE_LENGTH + 1} characters long" in refused[5]
    assert "must be JSON" in refused[7] and f"{progress.MAX_CHECKPOINT_BYTES + 1} bytes as JSON" in refused[9]
    assert seen == [(0, 0), (1, 1)]  # the largest good values were kept
    assert wait_for(lambda: kept(redis_client, broker) == (0, 0))


@pytest.mark.parametrize(
    "call",
    [
        lambda: progress.report(0.5),
        lambda: progress.checkpoint({}),
        progress.resume,
        progress.should_stop,
    ],
    ids=["report", "checkpoint", "resume", "should_stop"],
)
def test_outside_an_actor_each_call_is_a_runtime_error(broker: RedissonBroker, call: Callable[[], Any]) -> None:
    with pytest.raises(RuntimeError, match=r"must be called from inside an actor"):
        call()


# -- checkpoints ---------------------------------------------------------------------------------


def test_a_retry_resumes_from_the_checkpoint_which_success_drops(
    broker: RedissonBroker, redis_client: redis.Redis, start_worker: Callable[..., Worker]
) -> None:
    # Given a job that fails its first run after a checkpoint
    runs: list[Any] = []

    @dramatiq.actor(max_retries=3, min_backoff=50, max_backoff=50)
    def job() -> None:
        runs.append(progress.resume())
        progress.checkpoint({"run": len(runs)})
        if len(runs) == 1:
            raise RuntimeError("the first run fails")

    # When it runs, is retried and succeeds
    start_worker()
    job.send()
    broker.join("default", timeout=20_000)

    # Then the retry resumed from the checkpoint, and its success dropped it
    assert runs == [None, {"run": 1}]
    assert wait_for(lambda: kept(redis_client, broker) == (0, 0))


def test_a_dead_lettered_message_drops_its_checkpoint_and_report(
    broker: RedissonBroker, redis_client: redis.Redis, start_worker: Callable[..., Worker]
) -> None:
    @dramatiq.actor(max_retries=0)
    def job() -> None:
        progress.checkpoint({"at": 3})
        progress.report(0.3)
        raise ValueError("fails for good")

    start_worker()
    job.send()
    broker.join("default", timeout=10_000)
    assert broker.dead_letters("default").size() == 1
    assert wait_for(lambda: kept(redis_client, broker) == (0, 0))


def test_a_message_that_calls_none_of_it_costs_no_command(
    broker: RedissonBroker, redis_client: redis.Redis, start_worker: Callable[..., Worker], monkeypatch: Any
) -> None:
    # Given a worker thread that runs a message that checkpoints, then plain ones
    cleared: list[str] = []
    original = progress_internals.Run.clear

    def clear(run: progress_internals.Run) -> None:
        cleared.append(run.message_id)
        original(run)

    monkeypatch.setattr(progress_internals.Run, "clear", clear)

    @dramatiq.actor(max_retries=0)
    def saving() -> None:
        progress.checkpoint({"x": 1})

    @dramatiq.actor(max_retries=0)
    def plain() -> None:
        pass

    start_worker()
    used = saving.send()
    for _ in range(3):
        plain.send()
    broker.join("default", timeout=10_000)

    # Then only the message that checkpointed had its state cleared: the others sent nothing
    assert wait_for(lambda: cleared == [used.message_id])
    time.sleep(0.2)
    assert cleared == [used.message_id]
    assert not redis_client.exists(broker.keys("default").progress, broker.keys("default").checkpoints)


# -- Interrupted and should_stop -----------------------------------------------------------------


def test_interrupted_runs_again_at_once_without_counting_a_retry_even_on_its_last_retry(
    broker: RedissonBroker, redis_client: redis.Redis, start_worker: Callable[..., Worker]
) -> None:
    # Given a job allowed one retry: it fails once, is interrupted on that retry, then succeeds
    broker.add_middleware(CurrentMessage())
    runs: list[tuple[Any, int, float]] = []

    @dramatiq.actor(max_retries=1, min_backoff=50, max_backoff=50)
    def job() -> None:
        message = CurrentMessage.get_current_message()
        assert message is not None
        runs.append((progress.resume(), message.options.get("retries", 0), time.monotonic()))
        progress.checkpoint({"run": len(runs)})
        if len(runs) == 1:
            raise RuntimeError("the first run fails")
        if len(runs) == 2:
            raise progress.Interrupted()

    start_worker()
    job.send()
    broker.join("default", timeout=20_000)

    # Then the run after the interruption came at once, with the retry count it had, from
    # the checkpoint; nothing was dead-lettered, and the success dropped the checkpoint
    assert [(state, retries) for state, retries, _ in runs] == [(None, 0), ({"run": 1}, 1), ({"run": 2}, 1)]
    assert runs[2][2] - runs[1][2] < 2.0  # a retry's back-off would be 15 s by default
    assert broker.dead_letters("default").size() == 0
    assert wait_for(lambda: kept(redis_client, broker) == (0, 0))


def test_should_stop_turns_true_when_the_worker_stops_and_the_next_worker_resumes(
    broker: RedissonBroker, redis_client: redis.Redis, start_worker: Callable[..., Worker]
) -> None:
    # Given a 40-step job (50 ms a step) that checkpoints each step and stops when told
    steps: list[tuple[int, int]] = []  # (worker thread, step)
    stops: list[float] = []

    @dramatiq.actor(queue_name="long", max_retries=0)
    def job(total: int) -> None:
        state = progress.resume() or {"step": 0}
        while state["step"] < total:
            time.sleep(0.05)
            steps.append((threading.get_ident(), state["step"]))
            state["step"] += 1
            progress.checkpoint(state)
            if progress.should_stop():
                stops.append(time.monotonic())
                raise progress.Interrupted()

    first = start_worker(queues={"long"})
    job.send(40)
    assert wait_for(lambda: len(steps) >= 5)
    assert not stops

    # When its worker stops
    asked = time.monotonic()
    first.stop()
    stopped_in = time.monotonic() - asked

    # Then the job stopped within a step or two, and its message waits on the queue
    assert len(stops) == 1 and stops[0] - asked < 1.0 and stopped_in < 5.0, (stops, asked, stopped_in)
    assert broker.stats("long")["queues"]["long"]["ready"] == 1
    done_first = len(steps)

    # When another worker runs it, then it resumes after the last step done: none twice
    start_worker(queues={"long"})
    broker.join("long", timeout=10_000)
    assert [step for _, step in steps] == list(range(40))
    assert len({thread for thread, _ in steps[:done_first]}) == 1 and done_first < 40
    assert wait_for(lambda: kept(redis_client, broker, "long") == (0, 0))


@pytest.mark.topology
@pytest.mark.server_binary(min=(7, 0, 0))  # a cluster needs sharded pub/sub: older ones are refused at start
def test_on_a_cluster_a_sharded_queues_message_keeps_its_state_in_its_shards_slot() -> None:
    # Given a Redis Cluster, and a queue spread over 3 shards
    with Cluster(masters=3, replicas=0) as cluster:
        broker = RedissonBroker(
            client=cluster.client(), middleware=[m() for m in default_middleware], shards={"wide": 3}
        )
        runs: list[Any] = []
        release = threading.Event()

        @dramatiq.actor(queue_name="wide", max_retries=0, broker=broker)
        def job() -> None:
            runs.append(progress.resume())
            progress.checkpoint({"run": len(runs)})
            progress.report(len(runs) / 2, f"run {len(runs)}")
            if len(runs) == 1:
                raise progress.Interrupted()
            release.wait(20)

        worker = Worker(broker, worker_timeout=100, worker_threads=1)
        worker.start()
        try:
            # When a message (sent to a shard other than the queue's first: the sends take
            # the shards in turn) is interrupted once, then runs again
            while broker.shard_router.target("wide", {}) != "wide":
                pass
            message = job.send()
            assert wait_for(lambda: len(runs) == 2, 20)
            assert wait_for(lambda: [m["progress"] for m in broker.running("wide")] == [1.0], 10)

            # Then the second run resumed from the first's checkpoint, and running() shows its
            # report, kept in the slot of the shard the message runs from
            assert runs == [None, {"run": 1}]
            [entry] = broker.running("wide")
            assert (entry["message_id"], entry["note"]) == (message.message_id, "run 2")
            shard = next(
                q
                for q in broker.shards_of("wide")
                if broker.client.hexists(broker.keys(q).checkpoints, message.message_id)
            )
            assert shard != "wide"
            assert key_slot(broker.keys(shard).checkpoints.encode()) == key_slot(broker.keys(shard).ready.encode())

            # And its success drops both
            release.set()
            assert wait_for(lambda: broker.running("wide") == [], 10)
            assert wait_for(lambda: not broker.client.hexists(broker.keys(shard).checkpoints, message.message_id), 10)
            assert not broker.client.hexists(broker.keys(shard).progress, message.message_id)
        finally:
            release.set()
            worker.stop()
            broker.close()


# -- a deploy: the dramatiq command's worker gets SIGTERM (or SIGKILL) --------------------------

#: The long job of these tests: 100 steps of 100 ms, a checkpoint after each (10 s).
STEPS, STEP_MS = 100, 100


def _dramatiq(redis_url: str, log: Any) -> subprocess.Popen[bytes]:
    env = {**os.environ, "REDIS_URL": redis_url, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "dramatiq", "tests.progress_app:broker", "-p", "1", "-t", "1", "-Q", "long"]
    return subprocess.Popen(command, env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _events(client: redis.Redis, name: str) -> list[dict[str, Any]]:
    return [r for r in records(client) if r.get("event") == name]


def _deploy(
    broker: RedissonBroker, client: redis.Redis, redis_url: str, logs: Path, stop: signal.Signals
) -> dict[str, int]:
    """Run the long job on an old worker (the ``dramatiq`` command, one process, one
    thread), start a new one beside it after 20 steps, then send ``stop`` to the old one
    (SIGTERM: to its main process, as a deploy does; SIGKILL: to its whole process group,
    a crash) and wait for the job to be done. Returns the server times (ms) of the signal
    and of the old worker's exit."""

    def consumers() -> int:
        return broker.stats("long")["queues"]["long"]["consumers"] if "long" in broker.known_queues() else 0

    def tail(name: str) -> str:
        return (logs / name).read_text()[-3000:]

    with (logs / "old.log").open("wb") as old_log, (logs / "new.log").open("wb") as new_log:
        old = _dramatiq(redis_url, old_log)
        new: subprocess.Popen[bytes] | None = None
        try:
            assert wait_for(lambda: consumers() == 1, 30, 0.1), tail("old.log")
            message = dramatiq.Message(
                queue_name="long", actor_name="long_job", args=(STEPS, STEP_MS), kwargs={}, options={}
            )
            broker.enqueue(message)
            assert wait_for(lambda: len(_events(client, "step")) >= 20, 30, 0.05), tail("old.log")
            new = _dramatiq(redis_url, new_log)
            assert wait_for(lambda: consumers() == 2, 30, 0.1), tail("new.log")
            signalled_ms = server_ms(client)
            if stop == signal.SIGKILL:
                os.killpg(old.pid, signal.SIGKILL)
            else:
                old.send_signal(stop)
            old.wait(timeout=30)
            exited_ms = server_ms(client)
            assert old.returncode == (-signal.SIGKILL if stop == signal.SIGKILL else 0), tail("old.log")
            assert wait_for(lambda: len(_events(client, "done")) == 1, 60, 0.05), tail("new.log")
        finally:
            _stop(old)
            if new is not None:
                _stop(new)
    assert wait_for(lambda: kept(client, broker, "long") == (0, 0))
    return {"signalled_ms": signalled_ms, "exited_ms": exited_ms}


def _steps_run_twice(client: redis.Redis) -> int:
    """How many steps ran twice; every step ran (at least once)."""
    done = [r["step"] for r in _events(client, "step")]
    assert sorted(set(done)) == list(range(STEPS)), done
    return len(done) - len(set(done))


@pytest.mark.slow
def test_a_long_job_stopped_by_sigterm_resumes_on_the_next_worker_from_its_checkpoint(
    broker: RedissonBroker, redis_client: redis.Redis, redis_url: str, tmp_path: Path
) -> None:
    """The issue's goal, scaled down: a 10 s job whose worker gets SIGTERM stops within 2 s;
    the next worker resumes it from its last checkpoint, at most one step runs twice, and
    no retry is counted."""
    # Given the job running on the old worker, and a new worker beside it
    # When the old worker gets SIGTERM, as a deploy sends it
    times = _deploy(broker, redis_client, redis_url, tmp_path, signal.SIGTERM)

    # Then the job stopped within 2 s on the old worker
    [stopping] = _events(redis_client, "stopping")
    stop_ms = stopping["at_ms"] - times["signalled_ms"]
    assert 0 <= stop_ms < 2000, stop_ms
    # And the new worker resumed from the last checkpoint, with no retry counted
    resumed = _events(redis_client, "resumed")
    assert [r["step"] for r in resumed] == [0, stopping["step"]] and resumed[1]["retries"] == 0
    assert resumed[1]["pid"] != resumed[0]["pid"] == stopping["pid"]
    twice = _steps_run_twice(redis_client)
    assert twice <= 1
    print(
        f"\nSIGTERM -> the job saw should_stop(): {stop_ms} ms; SIGTERM -> old worker exited: "
        f"{times['exited_ms'] - times['signalled_ms']} ms; Interrupted -> resumed on the new worker: "
        f"{resumed[1]['at_ms'] - stopping['at_ms']} ms; steps run twice: {twice}; "
        f"retries at the resumed run: {resumed[1]['retries']}"
    )


@pytest.mark.slow
def test_a_long_job_whose_worker_is_killed_resumes_on_the_next_worker_from_its_checkpoint(
    broker: RedissonBroker, redis_client: redis.Redis, redis_url: str, tmp_path: Path
) -> None:
    # Given the job running on the old worker, and a new worker beside it
    # When the old worker's processes are killed (kill -9)
    times = _deploy(broker, redis_client, redis_url, tmp_path, signal.SIGKILL)

    # Then the new worker resumed it (once the old one was found dead) from its last
    # checkpoint: at most the step under way ran twice, and no retry was counted
    resumed = _events(redis_client, "resumed")
    old_steps = [r["step"] for r in _events(redis_client, "step") if r["pid"] == resumed[0]["pid"]]
    assert len(resumed) == 2 and resumed[1]["pid"] != resumed[0]["pid"] and resumed[1]["retries"] == 0
    assert resumed[1]["step"] in (old_steps[-1], old_steps[-1] + 1), (old_steps[-1], resumed[1])
    twice = _steps_run_twice(redis_client)
    assert twice <= 1
    print(
        f"\nkill -9 -> resumed on the new worker: {resumed[1]['at_ms'] - times['signalled_ms']} ms "
        f"(found dead by its closed connections); steps run twice: {twice}; "
        f"retries at the resumed run: {resumed[1]['retries']}"
    )
