"""The workflow counter, ``dramatiq_redisson_workflows_total{event=...}``: counted in the
process that caused each event, read from a registry in-process and, summed over worker
processes, from the exporter of a real ``dramatiq`` command with the Prometheus middleware."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dramatiq
import pytest
from dramatiq import Worker
from prometheus_client import CollectorRegistry

from dramatiq_redisson import RedissonBroker
from dramatiq_redisson import metrics as m
from dramatiq_redisson.embedded import free_loopback_port
from dramatiq_redisson.workflows import chain, group
from tests.helpers import wait_for
from tests.test_metrics import ROOT, scrape, stop, value

COUNTER = "dramatiq_redisson_workflows_total"


@pytest.fixture
def actors(broker: RedissonBroker) -> Iterator[dict[str, Any]]:
    """``add`` (succeeds), ``boom`` (fails for good) and ``hold`` (runs until released)."""
    release = threading.Event()

    @dramatiq.actor(max_retries=0)
    def add(*args: Any) -> int:
        return sum(arg for arg in args if isinstance(arg, int))

    @dramatiq.actor(max_retries=0)
    def boom(*args: Any) -> None:
        raise RuntimeError("boom")

    @dramatiq.actor(max_retries=0)
    def hold(*args: Any) -> None:
        release.wait(10)

    yield {"add": add, "boom": boom, "hold": hold, "release": release}
    release.set()


def counts(registry: CollectorRegistry) -> dict[str, float | None]:
    return {event: registry.get_sample_value(COUNTER, {"event": event}) for event in m.WORKFLOW_EVENTS}


def test_workflow_counter_counts_started_done_failed_and_cancelled(
    actors: dict[str, Any], broker: RedissonBroker, worker: Worker
) -> None:
    add, boom, hold, release = actors["add"], actors["boom"], actors["hold"], actors["release"]
    # Given the counter on a fresh registry: a series per event from the start, at 0
    registry = CollectorRegistry()
    listener = m.instrument_workflows(broker, registry)
    assert m.instrument_workflows(broker, registry) is listener
    assert broker.workflows.listeners.count(listener) == 1
    assert counts(registry) == {"started": 0.0, "done": 0.0, "failed": 0.0, "cancelled": 0.0}

    # When one workflow succeeds, one fails, and one is cancelled while its first step runs
    assert chain(add.message(1), group([add.message(2), add.message(3)])).run().wait(timeout=20).state == "done"
    assert chain(add.message(1), boom.message(), add.message(2)).run().wait(timeout=20).state == "failed"
    held = chain(hold.message(), add.message(4)).run()
    assert wait_for(lambda: (state := held.get()) is not None and state.steps[0].state == "running", timeout=10)
    assert held.cancel() is True
    assert held.cancel() is False  # finished already: not counted again
    # (the step running then goes on to its end and its ack, and records nothing)
    release.set()
    assert wait_for(lambda: broker.running("default") == [], timeout=10)

    # Then each event is counted once (the worker thread counts its end after its record)
    expected = {"started": 3.0, "done": 1.0, "failed": 1.0, "cancelled": 1.0}
    assert wait_for(lambda: counts(registry) == expected, timeout=5), counts(registry)
    # and a workflow cancelled before it ends is not counted as done or failed too
    assert not wait_for(lambda: counts(registry) != expected, timeout=0.5), counts(registry)


def test_workflow_counter_counts_only_workflow_events(broker: RedissonBroker) -> None:
    registry = CollectorRegistry()
    listener = m.instrument_workflows(broker, registry)
    listener("started")
    listener("retried")  # not an event of a workflow: no series
    assert counts(registry)["started"] == 1.0
    assert registry.get_sample_value(COUNTER, {"event": "retried"}) is None


def test_worker_processes_with_the_prometheus_middleware_export_the_workflow_counter(
    broker: RedissonBroker, redis_url: str, tmp_path: Path
) -> None:
    # Given the dramatiq command running 2 worker processes with this package's Prometheus
    # middleware
    port = free_loopback_port()
    env = {k: v for k, v in os.environ.items() if k.lower() != "prometheus_multiproc_dir"}
    env.update(
        REDIS_URL=redis_url,
        PYTHONPATH=str(ROOT),
        dramatiq_prom_host="127.0.0.1",
        dramatiq_prom_port=str(port),
        dramatiq_prom_db=str(tmp_path / "prom"),
    )
    app = "tests.workflows.workflow_metrics_app:broker"
    command = [sys.executable, "-m", "dramatiq", app, "-p", "2", "-t", "2", "-Q", "default"]
    url = f"http://127.0.0.1:{port}/metrics"
    log_path = tmp_path / "dramatiq.log"

    def consumers() -> int:
        return broker.stats("default")["queues"]["default"]["consumers"] if "default" in broker.known_queues() else 0

    def step(actor_name: str, *args: Any) -> dramatiq.Message[Any]:
        return dramatiq.Message(queue_name="default", actor_name=actor_name, args=args, kwargs={}, options={})

    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            command, env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            assert wait_for(lambda: scrape(url) is not None and consumers() == 2, 30, 0.1), log_path.read_text()[-3000:]
            # When this process runs 4 workflows that succeed and 2 that fail, on those workers
            runs = [chain(step("add", i), group([step("add"), step("add")])).run() for i in range(4)]
            runs += [chain(step("add", i), step("boom"), step("add")).run() for i in range(2)]
            states = [run.wait(timeout=30).state for run in runs]
            assert states == ["done"] * 4 + ["failed"] * 2

            # Then the exporter serves the workers' counts, summed over the processes: the
            # ends they caused; the starts were this process's, which has no counter
            def exported() -> dict[str, float | None]:
                samples = scrape(url) or {}
                return {event: value(samples, COUNTER, event=event) for event in m.WORKFLOW_EVENTS}

            expected = {"started": 0.0, "done": 4.0, "failed": 2.0, "cancelled": 0.0}
            last: list[dict[str, float | None]] = []
            assert wait_for(lambda: last.append(exported()) or last[-1] == expected, timeout=10, interval=0.2), last[-1]
        finally:
            stop(proc, signal.SIGTERM)
    output = log_path.read_text()
    assert proc.returncode == 0, output[-3000:]
