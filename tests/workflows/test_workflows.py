"""Workflows on a real server: chains and groups, nested, delayed, with both failure
policies, results passed on, state by id, cancel, retention and bad input."""

from __future__ import annotations

import threading
import time
from typing import Any

import dramatiq
import pytest
import redis
from dramatiq import Worker

from dramatiq_redisson import RedissonBroker
from dramatiq_redisson.workflows import chain, group
from tests.helpers import server_ms

pytestmark = pytest.mark.usefixtures("worker")


@pytest.fixture
def calls(broker: RedissonBroker) -> list[tuple[str, tuple[Any, ...]]]:
    return []


@pytest.fixture
def steps(broker: RedissonBroker, calls: list[tuple[str, tuple[Any, ...]]]) -> dict[str, Any]:
    lock = threading.Lock()

    def note(name: str, args: tuple[Any, ...]) -> None:
        with lock:
            calls.append((name, args))

    @dramatiq.actor(max_retries=0)
    def add(*args: Any) -> int:
        note("add", args)
        return sum(a if isinstance(a, int) else sum(x or 0 for x in a) for a in args)

    @dramatiq.actor(max_retries=0)
    def ident(*args: Any) -> Any:
        note("ident", args)
        return list(args)

    @dramatiq.actor(max_retries=0)
    def boom(*args: Any) -> None:
        note("boom", args)
        raise RuntimeError("boom")

    @dramatiq.actor(max_retries=2, min_backoff=10, max_backoff=20)
    def flaky(key: str, *args: Any) -> str:
        note("flaky", (key, *args))
        if sum(1 for name, a in calls if name == "flaky" and a[0] == key) < 3:
            raise RuntimeError("not yet")
        return key

    @dramatiq.actor(max_retries=0, pipe_ignore=True)
    def fresh(*args: Any) -> str:
        note("fresh", args)
        return "fresh"

    @dramatiq.actor(max_retries=0)
    def not_json(*args: Any) -> object:
        note("not_json", args)
        return object()

    @dramatiq.actor(max_retries=0)
    def slow(seconds: float, *args: Any) -> float:
        note("slow", (seconds, *args))
        time.sleep(seconds)
        return seconds

    return {
        "add": add,
        "ident": ident,
        "boom": boom,
        "flaky": flaky,
        "fresh": fresh,
        "not_json": not_json,
        "slow": slow,
    }


def test_a_chain_passes_each_result_to_the_next_step(steps: dict[str, Any], broker: RedissonBroker) -> None:
    add = steps["add"]
    run = chain(add.message(1, 2), add.message(10), add.message(100)).run()
    state = run.wait(timeout=20)
    assert state.state == "done"
    assert state.result == 113
    assert [s.state for s in state.steps] == ["done", "done", "done"]
    assert [s.result for s in state.steps] == [3, 13, 113]
    for s in state.steps:
        assert s.sent_ms is not None and s.started_ms is not None and s.finished_ms is not None
        assert s.sent_ms <= s.started_ms + 5 and s.started_ms <= s.finished_ms
    assert state.steps[1].sent_ms >= state.steps[0].finished_ms  # type: ignore[operator]


def test_a_group_passes_the_list_of_its_results_in_member_order(
    steps: dict[str, Any], calls: list[tuple[str, tuple[Any, ...]]]
) -> None:
    add, ident = steps["add"], steps["ident"]
    run = chain(
        add.message(1),
        group([add.message(i) for i in range(5)]),
        ident.message(),
    ).run()
    state = run.wait(timeout=20)
    assert state.state == "done"
    # every member got the result before the group (1); the step after it, one list
    assert sorted(a for n, a in calls if n == "add" and len(a) == 2) == [(i, 1) for i in range(5)]
    assert state.result == [[i + 1 for i in range(5)]]


def test_nested_groups_and_chains(steps: dict[str, Any]) -> None:
    add, ident = steps["add"], steps["ident"]
    run = group(
        [
            chain(add.message(1), add.message(2)),  # 3
            group([add.message(10), chain(add.message(20), group([add.message(1), add.message(2)]))]),
            add.message(5),
        ]
    ).run()
    state = run.wait(timeout=30)
    assert state.state == "done", state
    # member 1: [10, [21, 22]]: a chain's result is its last step's
    assert state.result == [3, [10, [21, 22]], 5]
    assert [s.path for s in state.steps] == ["0.0", "0.1", "1.0", "1.1.0", "1.1.1.0", "1.1.1.1", "2"]
    assert state.tree.kind == "group" and [c.kind for c in state.tree.children] == ["chain", "group", "step"]
    _ = ident


def test_pipe_ignore_keeps_a_step_from_getting_the_result(
    steps: dict[str, Any], calls: list[tuple[str, tuple[Any, ...]]]
) -> None:
    add, fresh, ident = steps["add"], steps["fresh"], steps["ident"]
    state = (
        chain(add.message(1), fresh.message(), ident.message_with_options(args=(7,), pipe_ignore=True), ident.message())
        .run()
        .wait(timeout=20)
    )
    assert state.state == "done"
    assert [a for n, a in calls if n in ("fresh", "ident")] == [(), (7,), ([7],)]


def test_a_failed_member_fails_the_group_and_nothing_after_it_runs(
    steps: dict[str, Any], calls: list[tuple[str, tuple[Any, ...]]]
) -> None:
    add, boom, ident = steps["add"], steps["boom"], steps["ident"]
    state = chain(group([add.message(1), boom.message(), add.message(2)]), ident.message()).run().wait(timeout=20)
    assert state.state == "failed"
    by_path = {s.path: s for s in state.steps}
    assert by_path["0.0"].state == "done" and by_path["0.2"].state == "done"  # the group waited for all
    assert by_path["0.1"].state == "failed"
    assert by_path["1"].state == "skipped" and by_path["1"].sent_ms is None
    time.sleep(0.3)
    assert not [n for n, _ in calls if n == "ident"]


def test_continue_runs_the_next_step_with_none_for_failed_members(steps: dict[str, Any]) -> None:
    add, boom, ident = steps["add"], steps["boom"], steps["ident"]
    state = (
        chain(group([add.message(1), boom.message(), add.message(2)], on_failure="continue"), ident.message())
        .run()
        .wait(timeout=20)
    )
    assert state.state == "done"
    assert state.result == [[1, None, 2]]


def test_a_step_retried_counts_when_it_succeeds(
    steps: dict[str, Any], calls: list[tuple[str, tuple[Any, ...]]]
) -> None:
    flaky, ident = steps["flaky"], steps["ident"]
    state = chain(flaky.message("k"), ident.message()).run().wait(timeout=30)
    assert state.state == "done"
    assert [n for n, _ in calls].count("flaky") == 3
    assert state.result == ["k"]


def test_a_step_that_fails_for_good_fails_the_chain(
    steps: dict[str, Any], calls: list[tuple[str, tuple[Any, ...]]], broker: RedissonBroker
) -> None:
    add, boom = steps["add"], steps["boom"]
    state = chain(add.message(1), boom.message(), add.message(2)).run().wait(timeout=20)
    assert state.state == "failed"
    assert [s.state for s in state.steps] == ["done", "failed", "skipped"]
    assert broker.dead_letters("default").size() == 1  # dead-lettered, as any message


def test_a_result_that_is_not_json_fails_the_step_with_an_error_naming_it(
    steps: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    not_json, add = steps["not_json"], steps["add"]
    state = chain(add.message(1), not_json.message(), add.message(1)).run().wait(timeout=20)
    assert state.state == "failed"
    assert [s.state for s in state.steps] == ["done", "failed", "skipped"]
    assert any("Step 1 (not_json)" in r.getMessage() and "not JSON" in r.getMessage() for r in caplog.records)


def test_a_delayed_step_waits_from_when_it_is_sent(steps: dict[str, Any], redis_client: redis.Redis) -> None:
    add = steps["add"]
    state = chain(add.message(1), add.message_with_options(args=(2,), delay=400)).run().wait(timeout=20)
    assert state.state == "done"
    first, second = state.steps
    assert second.delay_ms == 400
    assert second.started_ms - first.finished_ms >= 400  # type: ignore[operator]


def test_cancel_stops_what_has_not_started(
    steps: dict[str, Any], calls: list[tuple[str, tuple[Any, ...]]], broker: RedissonBroker
) -> None:
    slow, add = steps["slow"], steps["add"]
    run = chain(
        slow.message(0.5),
        group([add.message(1), add.message_with_options(args=(2,), delay=60_000)]),
        add.message(3),
    ).run()
    deadline = time.monotonic() + 10
    while not any(n == "slow" for n, _ in calls) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert run.cancel() is True
    state = run.get()
    assert state is not None and state.state == "cancelled"
    time.sleep(1.0)  # the running step finishes; nothing after it is sent
    assert [n for n, _ in calls] == ["slow"]
    assert run.cancel() is False  # finished already
    assert broker.delayed_queue("default").count() == 0


def test_cancel_removes_scheduled_steps_and_skips_queued_ones(
    steps: dict[str, Any], calls: list[tuple[str, tuple[Any, ...]]], broker: RedissonBroker
) -> None:
    add = steps["add"]
    run = group(
        [add.message_with_options(args=(1,), delay=60_000), add.message_with_options(args=(2,), delay=60_000)]
    ).run()
    assert broker.delayed_queue("default").count() == 2
    run.cancel()
    assert broker.delayed_queue("default").count() == 0
    state = run.get()
    assert state is not None and [s.state for s in state.steps] == ["cancelled", "cancelled"]


def test_get_of_an_unknown_workflow_is_none_and_cancel_raises(broker: RedissonBroker) -> None:
    assert broker.workflows.get("no-such") is None
    with pytest.raises(LookupError, match="no-such"):
        broker.workflows.cancel("no-such")


def test_list_shows_the_newest_first(steps: dict[str, Any], broker: RedissonBroker) -> None:
    add = steps["add"]
    runs = [chain(add.message(i)).run() for i in range(3)]
    for run in runs:
        run.wait(timeout=20)
    listed = broker.workflows.list(limit=10)
    assert [w.id for w in listed] == [r.id for r in reversed(runs)]
    assert all(w.state == "done" and w.steps == 1 for w in listed)
    assert broker.workflows.list(state="running") == []


def test_a_finished_workflow_is_removed_after_its_retention(
    steps: dict[str, Any], broker: RedissonBroker, redis_client: redis.Redis
) -> None:
    broker.workflow_retention = 300
    add = steps["add"]
    run = chain(add.message(1)).run()
    assert run.wait(timeout=20).state == "done"
    time.sleep(0.5)
    assert broker.workflows.get(run.id) is None
    chain(add.message(2)).run().wait(timeout=20)  # a later finish trims the indexes
    assert run.id.encode() not in redis_client.zrange(broker.workflows.keys.index, 0, -1)


def test_bad_steps_are_refused_before_anything_is_written(steps: dict[str, Any], redis_client: redis.Redis) -> None:
    add = steps["add"]
    with pytest.raises(TypeError, match="a step is a message"):
        chain(add.message(1), "nope")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="at least one"):
        group([])
    with pytest.raises(ValueError, match="on_failure"):
        group([add.message(1)], on_failure="ignore")
    message = add.message(1)
    with pytest.raises(ValueError, match="twice"):
        chain(message, message).run()
    # nothing of a workflow was written, and nothing was sent (not the key count: the
    # worker's consumer writes its own keys meanwhile)
    assert redis_client.keys("dramatiq:__workflows__*") == []
    assert redis_client.llen("dramatiq:default") == 0 and redis_client.hlen("dramatiq:default.msgs") == 0


def test_a_workflow_with_many_steps_is_one_record(
    steps: dict[str, Any], redis_client: redis.Redis, broker: RedissonBroker
) -> None:
    add = steps["add"]
    before = redis_client.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0)
    run = chain(*[add.message(i) for i in range(50)]).run()
    state = run.wait(timeout=60)
    assert state.state == "done"
    assert state.result == sum(range(50))
    _ = before, server_ms


def test_dramatiq_own_pipeline_and_group_still_work(steps: dict[str, Any], broker: RedissonBroker) -> None:
    add = steps["add"]
    dramatiq.pipeline([add.message(1), add.message(2)]).run()
    dramatiq.group([add.message(3), add.message(4)]).run()
    broker.join("default", timeout=10_000)


def test_a_worker_adds_the_workflow_middleware_once_and_a_broker_keeps_its_list_until_then(
    make_broker: Any, redis_url: str
) -> None:
    other = make_broker(RedissonBroker, url=redis_url, middleware=[])
    assert other.middleware == []  # as given, as the built-in broker keeps it
    for _ in range(2):
        worker = Worker(other, worker_timeout=100, worker_threads=1)
        worker.start()
        worker.stop()
    assert [type(m).__name__ for m in other.middleware].count("WorkflowSteps") == 1
    default = make_broker(RedissonBroker, url=redis_url)
    worker = Worker(default, worker_timeout=100, worker_threads=1)
    worker.start()
    worker.stop()
    names = [type(m).__name__ for m in default.middleware]
    assert names.index("WorkflowSteps") == names.index("Retries") - 1  # its after hooks run after Retries'
