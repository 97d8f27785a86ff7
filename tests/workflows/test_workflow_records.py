"""The record of a step on a real server, driven directly: a step recorded twice counts
once and sends what follows it once; a caller that dies between the record of a
workflow and the send of its first steps is made good by the sweep; a step whose
record is refused (a full server) is neither acked nor dead-lettered, runs again, and
its workflow finishes."""

from __future__ import annotations

import threading
from typing import Any

import dramatiq
import pytest
import redis
from dramatiq import Message

from dramatiq_redisson import RedissonBroker
from dramatiq_redisson.workflows import chain, group
from dramatiq_redisson.workflows._compose import OPTION, Nav, compile_workflow
from tests.helpers import wait_for


@pytest.fixture
def ran(broker: RedissonBroker) -> list[tuple[str, tuple[Any, ...]]]:
    return []


@pytest.fixture
def job(broker: RedissonBroker, ran: list[tuple[str, tuple[Any, ...]]]) -> Any:
    @dramatiq.actor(max_retries=0)
    def job(name: str, *args: Any) -> str:
        ran.append((name, args))
        return name

    return job


def _nav(broker: RedissonBroker, workflow_id: str, number: int) -> Nav:
    raw = broker.client.hget(broker.workflows.keys.workflow(workflow_id), f"m:{number}")
    nav: Nav = Message.decode(raw).options[OPTION]
    return nav


def test_a_step_recorded_twice_counts_once_and_starts_what_follows_once(
    broker: RedissonBroker, job: Any, redis_client: redis.Redis
) -> None:
    run = chain(job.message("a"), group([job.message("x"), job.message("y")]), job.message("z")).run()
    keys = broker.keys("default")
    assert redis_client.llen(keys.ready) == 1  # "a", not run: no worker
    a = _nav(broker, run.id, 1)
    assert broker.workflows.record(a, ok=True, result='"a"', took_ms=1) == "recorded"
    assert redis_client.llen(keys.ready) == 3  # x and y
    # again (a redelivery): nothing new, and x and y are not pushed twice (same message ids)
    assert broker.workflows.record(a, ok=True, result='"other"', took_ms=1) == "again"
    assert redis_client.llen(keys.ready) == 3
    x, y = _nav(broker, run.id, 3), _nav(broker, run.id, 4)
    broker.workflows.record(x, ok=True, result='"x"', took_ms=1)
    broker.workflows.record(x, ok=True, result='"x"', took_ms=1)  # counted once: the group still waits
    assert redis_client.hget(broker.workflows.keys.workflow(run.id), "c:2") == b"1"
    assert redis_client.llen(keys.ready) == 3
    broker.workflows.record(y, ok=True, result='"y"', took_ms=1)
    assert redis_client.llen(keys.ready) == 4  # z
    state = broker.workflows.get(run.id)
    assert state is not None
    assert [s.state for s in state.steps] == ["done", "done", "done", "sent"]
    assert state.steps[0].result == "a"  # the first record stands
    # z's message carries the group's results, in member order
    z_id = state.steps[3].message_id
    z = Message.decode(redis_client.hget(keys.ready_msgs, z_id))
    assert z.args == ("z", ["x", "y"])


def test_a_replay_after_the_next_step_finished_sends_nothing(
    broker: RedissonBroker, job: Any, redis_client: redis.Redis
) -> None:
    run = chain(job.message("a"), job.message("b")).run()
    a, b = _nav(broker, run.id, 1), _nav(broker, run.id, 2)
    broker.workflows.record(a, ok=True, result='"a"', took_ms=1)
    broker.workflows.record(b, ok=True, result='"b"', took_ms=1)
    assert broker.workflows.get(run.id).state == "done"  # type: ignore[union-attr]
    redis_client.delete(broker.keys("default").ready)
    assert broker.workflows.record(a, ok=True, result='"a"', took_ms=1) == "again"
    assert redis_client.llen(broker.keys("default").ready) == 0


def test_the_sweep_sends_the_first_steps_of_a_workflow_whose_caller_died(
    broker: RedissonBroker, job: Any, ran: list[tuple[str, tuple[Any, ...]]], make_worker: Any
) -> None:
    compiled = compile_workflow(group([job.message("p"), job.message("q")]))
    flat: list[Any] = [item for pair in compiled.fields.items() for item in pair]
    # Recorded, then the caller "died": nothing was sent.
    broker.workflows.scripts.run(compiled.id, compiled.root, compiled.steps, flat)
    assert broker.workflows.sweep() == 0  # younger than the grace
    assert broker.workflows.sweep(older_than_ms=0) == 1
    assert broker.workflows.sweep(older_than_ms=0) == 0  # sent: no longer pending
    make_worker()
    assert wait_for(lambda: broker.workflows.get(compiled.id).state == "done", timeout=10)  # type: ignore[union-attr]
    assert sorted(name for name, _ in ran) == ["p", "q"]


@pytest.mark.parametrize("fails", [False, True], ids=["succeeds", "fails"])
def test_a_step_whose_record_is_refused_runs_again_and_its_workflow_finishes(
    broker: RedissonBroker, redis_client: redis.Redis, make_worker: Any, fails: bool
) -> None:
    started, release = threading.Event(), threading.Event()
    runs: list[str] = []

    @dramatiq.actor(max_retries=0)
    def first() -> str:
        runs.append("first")
        started.set()
        release.wait(10)
        if fails:
            raise RuntimeError("failed for good")
        return "ok"

    @dramatiq.actor(max_retries=0)
    def second(value: str) -> None:
        runs.append("second")

    run = chain(first.message(), second.message()).run()
    make_worker(worker_threads=1)
    assert started.wait(10)
    limit = redis_client.config_get("maxmemory")["maxmemory"]
    redis_client.config_set("maxmemory", 1)  # every growing write is refused: the record too
    try:
        release.set()
        # refused: the step is neither acked nor dead-lettered
        assert not wait_for(lambda: broker.workflows.get(run.id).state != "running", timeout=1.0)  # type: ignore[union-attr]
    finally:
        redis_client.config_set("maxmemory", limit)
    state = run.wait(timeout=30)
    # it ran again (more than once if it came back while the server was still full)
    assert runs.count("first") >= 2
    assert state.state == ("failed" if fails else "done")
    assert runs.count("second") == (0 if fails else 1)
    assert broker.dead_letters("default").size() == (1 if fails else 0)
