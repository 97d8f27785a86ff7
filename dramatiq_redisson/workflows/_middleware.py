"""The middleware that moves workflows on: :class:`WorkflowSteps`, which the broker adds
by itself when a worker boots (the list given to the broker stays as given until then).

- **Before a step runs**: one ``HGET`` of its workflow's state. A step of a workflow
  that was cancelled (or that failed, or is gone) is skipped (``SkipMessage``: acked,
  never run).
- **After it ran**: a step that succeeded, or failed for good (``message.failed``: its
  retries are exhausted, or ``throws``, or another middleware failed it), is recorded
  (``step.lua``) and the steps that start because of it are sent, before the step's ack.
  A step that will be retried is not recorded. If the record or the sends fail, the
  step is not acked: it runs again later, and its record then changes nothing but sends
  what it started again (see :mod:`._store`).
- A step's return value is passed on as JSON; one that is not JSON fails the step for
  good, with an error that names the workflow, the step and the actor.

It must see ``message.failed`` as ``Retries`` leaves it: Dramatiq runs the ``after_``
hooks in the reverse order of the middleware list, so the broker puts this one before
``Retries``.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from typing import Any

import redis
from dramatiq.broker import Broker
from dramatiq.middleware import Middleware, Retries, SkipMessage

from .._logs import logger_for
from ._compose import OPTION, Nav
from ._store import SWEEP_INTERVAL_S, Workflows


def add_workflow_steps(broker: Broker) -> None:
    """Add :class:`WorkflowSteps` to ``broker``, before ``Retries`` when there is one (it
    must see ``message.failed`` as ``Retries`` leaves it: see the module); not twice."""
    if any(isinstance(m, WorkflowSteps) for m in broker.middleware):
        return
    retries = next((type(m) for m in broker.middleware if isinstance(m, Retries)), None)
    broker.add_middleware(WorkflowSteps(), before=retries)


def _workflows(broker: Broker) -> Workflows | None:
    """The broker's workflows (None: a broker that keeps none)."""
    workflows = getattr(broker, "workflows", None)
    return workflows if isinstance(workflows, Workflows) else None


class _DiscardedResultFilter(logging.Filter):
    """Drops the worker's warning that an actor's return value was discarded (no
    ``Results`` middleware) for workflow steps, whose results are passed on."""

    def __init__(self, local: threading.local) -> None:
        super().__init__()
        self.local = local

    def filter(self, record: logging.LogRecord) -> bool:
        return not (getattr(self.local, "nav", None) and "returned a value that is not None" in str(record.msg))


class WorkflowSteps(Middleware):
    """Records workflow steps as they finish and sends what follows them (see the module)."""

    def __init__(self) -> None:
        self.logger = logger_for(type(self))
        self._local = threading.local()
        self._filter = _DiscardedResultFilter(self._local)
        self._stop = threading.Event()
        self._sweeper: threading.Thread | None = None

    # -- a worker's life: the sweep ----------------------------------------------------

    def after_worker_boot(self, broker: Broker, worker: Any) -> None:
        logging.getLogger("dramatiq.worker.WorkerThread").addFilter(self._filter)
        workflows = _workflows(broker)
        # Not on a cluster yet: its calls on the shared cluster client, while a master is
        # down, held back the other shards' consumers past their bound
        # (tests/sharding/test_cluster_shards_faults.py); there broker.workflows.sweep()
        # is left to the operator (docs/workflows.md).
        if self._sweeper is None and workflows is not None and not workflows.broker.topology.spreads_shards:
            self._stop.clear()
            self._sweeper = threading.Thread(
                target=self._sweep, args=(_workflows(broker),), name="dramatiq-redisson-workflow-sweep", daemon=True
            )
            self._sweeper.start()

    def before_worker_shutdown(self, broker: Broker, worker: Any) -> None:
        self._stop.set()
        sweeper, self._sweeper = self._sweeper, None
        if sweeper is not None:
            sweeper.join(timeout=5)

    def _sweep(self, workflows: Workflows) -> None:
        while not self._stop.wait(SWEEP_INTERVAL_S):
            try:
                workflows.sweep()
            except Exception as e:  # the next sweep tries again
                self.logger.warning("Workflow sweep failed (%s); trying again in %.0f s.", e, SWEEP_INTERVAL_S)

    # -- a step's life ----------------------------------------------------------------

    def before_process_message(self, broker: Broker, message: Any) -> None:
        nav: Nav | None = message.options.get(OPTION)
        self._local.nav = nav
        if not nav:
            return
        self._local.started = time.monotonic()
        workflows = _workflows(broker)
        if workflows is None:
            return
        try:
            state = workflows.state_of(nav["id"])
        except (redis.RedisError, OSError) as e:
            # The step runs: its record (when the server is back) sends nothing after it
            # if the workflow was cancelled meanwhile.
            self.logger.warning(
                "Step %s of workflow %s runs without checking that its workflow still runs (%s).",
                nav["path"],
                nav["id"],
                e,
            )
            return
        if state != "running":
            self._local.nav = None
            self.logger.info(
                "Skipping step %s (%s) of workflow %s: the workflow is %s.",
                nav["path"],
                message.actor_name,
                nav["id"],
                state or "gone",
            )
            raise SkipMessage(f"workflow {nav['id']} is {state or 'gone'}")

    def after_process_message(
        self, broker: Broker, message: Any, *, result: Any = None, exception: BaseException | None = None
    ) -> None:
        nav: Nav | None = getattr(self._local, "nav", None)
        self._local.nav = None
        if not nav or message.options.get(OPTION) is not nav:
            return
        ok = exception is None and not message.failed
        if not ok and not message.failed:
            return  # to be retried: recorded when a run of it succeeds or fails for good
        encoded = "null"
        if ok:
            try:
                encoded = json.dumps(result, separators=(",", ":"), allow_nan=False)
            except (TypeError, ValueError) as e:
                self.logger.error(
                    "Step %s (%s) of workflow %s returned a value that is not JSON (%s: %s): the step fails; "
                    "a workflow passes results on as JSON.",
                    nav["path"],
                    message.actor_name,
                    nav["id"],
                    type(e).__name__,
                    e,
                )
                message.fail()
                ok = False
        took = int((time.monotonic() - getattr(self._local, "started", time.monotonic())) * 1000)
        self._record(broker, message, nav, ok, encoded, took)

    def after_skip_message(self, broker: Broker, message: Any) -> None:
        nav: Nav | None = getattr(self._local, "nav", None)
        self._local.nav = None
        if nav and message.failed:  # failed by another middleware (an age limit): for good
            self._record(broker, message, nav, False, "null", 0)

    def _record(self, broker: Broker, message: Any, nav: Nav, ok: bool, result: str, took: int) -> None:
        workflows = _workflows(broker)
        if workflows is None:
            return
        redis_message_id = message.options.get("redis_message_id")
        held = workflows.broker.held
        queue = held.queue_of(redis_message_id) if redis_message_id else None
        try:
            workflows.record(nav, ok=ok, result=result, took_ms=took, queue_name=queue)
        except (redis.RedisError, OSError) as e:
            # Not acked: it runs again, and its record then sends what it starts.
            self.logger.error(
                "Step %s (%s) of workflow %s could not be recorded (%s): it is not acked and runs again.",
                nav["path"],
                message.actor_name,
                nav["id"],
                e,
            )
            if queue is not None:
                held.release(queue, redis_message_id)
