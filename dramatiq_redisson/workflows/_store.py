"""``broker.workflows``: run a workflow, record its steps as they finish, send what follows,
and read or cancel one by id.

Where each thing lives (one HASH per workflow, ``lua/lib.lua`` lists its fields; the
indexes in :class:`~._scripts.WorkflowKeys`):

- **Run** (``run.lua``): one call records the whole tree (a 10 000-step workflow is one
  call) and returns its first steps; the caller then sends them with the broker's own
  sends, with the message ids recorded in the tree. The workflow stays in a ``pending``
  index until they are sent: if the caller dies in between, a worker's sweep (every
  :data:`SWEEP_INTERVAL_S` s, for workflows pending more than :data:`SWEEP_GRACE_MS`)
  sends them. The record is the commit point: a workflow either does not exist, or
  all of it runs.
- **Record** (``step.lua``, from the :class:`~._middleware.WorkflowSteps` middleware
  before the step's ack): one call marks the step finished, counts a group down, and
  returns the steps that start now; the worker sends them, then acks. A worker killed
  anywhere before the ack leaves the message unacked: it runs again, its record changes
  nothing the second time, and what the first one started is sent again under the same
  message ids, which the broker's sends deduplicate (an immediate message id is pushed
  once while queued, in flight or within ``dedupe_window``; a delayed one is scheduled
  once). So each step counts once and starts what follows it once.
- **Read** (:meth:`Workflows.get`): one ``HGETALL``; which steps were sent is worked out
  from the records (a step is sent when what comes before it finished), so no write is
  made when a step is sent or starts.

Retention: a finished (done, failed, cancelled) workflow is kept
``workflow_retention`` ms (a broker setting, default one day), then removed. What it
costs while kept: per step its encoded message (as in a queue) and its result's JSON,
plus about 140 bytes of fields and hash overhead (``docs/workflows.md`` has a measure).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Protocol, cast

import redis
from dramatiq.errors import ActorNotFound
from dramatiq.message import Message

from .._logs import logger_for
from .._message import epoch_ms
from ._compose import Nav, Step, compile_workflow
from ._reading import Reader
from ._scripts import Send, WorkflowKeys, WorkflowScripts
from ._states import Workflow, WorkflowState, WorkflowSummary

if TYPE_CHECKING:
    from .._held import HeldMessages
    from .._settings import BrokerSettings
    from ..admin._delayed_queue import DelayedQueue
    from ..admin._running import RunningMessage
    from ..connection._commands import Commands
    from ..connection._primary_watch import PrimaryWatch
    from ..connection._topology import Topology
    from ..scripts._calls import Scripts


class WorkflowsHost(Protocol):
    """What :class:`Workflows` reads of its broker (a ``RedissonBroker``)."""

    namespace: str
    client: Commands
    topology: Topology
    held: HeldMessages
    primary_watch: PrimaryWatch
    redisson_scripts: Scripts

    @property
    def settings(self) -> BrokerSettings: ...

    def enqueue(self, message: Message[Any], *, delay: int | None = None) -> Message[Any]: ...

    def enqueue_many(self, messages: Iterable[Message[Any]], *, delay: int | None = None) -> list[Message[Any]]: ...

    def get_actor(self, actor_name: str) -> Any: ...

    def running(self, queue_name: str | None = None) -> list[RunningMessage]: ...

    def delayed_queue(self, queue_name: str) -> DelayedQueue: ...


#: A workflow pending longer than this (ms) is one whose caller may have died before it
#: sent its first steps: the sweep sends them.
SWEEP_GRACE_MS = 10_000

#: How often (s) each worker process sweeps.
SWEEP_INTERVAL_S = 10.0


class Workflows:
    """A broker's workflows (``broker.workflows``; see the module)."""

    def __init__(self, broker: WorkflowsHost) -> None:
        self.broker = broker
        self.keys = WorkflowKeys(broker.namespace)
        self.scripts = WorkflowScripts(broker.client, broker.topology, self.keys)
        self.logger = logger_for(type(self))
        #: Called as ``listener(event)`` with "started", "done", "failed" or "cancelled"
        #: when this process starts or ends a workflow (the metrics count them).
        self.listeners: list[Callable[[str], None]] = []
        self._sweep_lock = threading.Lock()

    @property
    def retention_ms(self) -> int:
        return int(self.broker.settings.workflow_retention)

    # -- running ----------------------------------------------------------------------

    def run(self, root: Step) -> Workflow:
        """Record a workflow and send its first steps.

        Raises:
          TypeError, ValueError: A step that is not a message, chain or group; a message
            used twice; a message of an actor this process does not know is allowed.
          redis.RedisError: The record failed (nothing runs), or the first sends did (the
            workflow is recorded: a worker's sweep sends them within about
            :data:`SWEEP_GRACE_MS` ms).
        """
        compiled = compile_workflow(root)
        flat: list[Any] = []
        for name, value in compiled.fields.items():
            flat += (name, value)
        self.broker.primary_watch.start()
        self.scripts.run(compiled.id, compiled.root, compiled.steps, flat)
        self._notify("started")
        self.send_messages(compiled.first)
        self.broker.client.zrem(self.keys.pending, compiled.id)
        return Workflow(compiled.id, self)

    def record(self, nav: Nav, *, ok: bool, result: str, took_ms: int, queue_name: str | None = None) -> str:
        """Record a finished step and send the steps that start now (the middleware's
        call, before the step's ack). Returns the outcome ("recorded", "again",
        "gone"). ``queue_name``: the (internal) queue the step came from, whose last reply
        gave an estimate of the server's clock (one ``TIME`` less; not on a cluster,
        where the workflows' slot may be on another master)."""
        now = ""
        if queue_name is not None and not self.broker.topology.spreads_shards:
            now = self.broker.redisson_scripts.server_now_ms(queue_name)
        outcome, ended, sends = self.scripts.step(
            nav["id"], nav["n"], ok, result, took_ms, nav["p"], nav["pk"], nav["next"], self.retention_ms, now
        )
        if outcome == "gone":
            self.logger.warning(
                "Workflow %s is gone (its retention ended, or it was removed): step %s recorded nothing.",
                nav["id"],
                nav["path"],
            )
        if ended:
            self._notify(ended)
        self.send(sends)
        return outcome

    def send(self, sends: list[Send]) -> None:
        """Send steps (``(spec, message, input)`` from a script): each with its input
        appended to its arguments unless it has ``pipe_ignore``."""
        messages = []
        for _, data, given in sends:
            message = Message.decode(data)
            if given and not self._pipe_ignore(message):
                message = message.copy(args=(*message.args, json.loads(given)))
            messages.append(message)
        self.send_messages(messages)

    def send_messages(self, messages: list[Message[Any]]) -> None:
        """Send steps, each after its ``delay``; those of one delay in one bulk send."""
        by_delay: dict[int | None, list[Message[Any]]] = {}
        for message in messages:
            delay = message.options.get("delay")
            by_delay.setdefault(int(delay) if delay else None, []).append(message)
        for delay, batch in by_delay.items():
            if len(batch) == 1:
                self.broker.enqueue(batch[0], delay=delay)
            else:
                self.broker.enqueue_many(batch, delay=delay)

    def _pipe_ignore(self, message: Message[Any]) -> bool:
        if message.options.get("pipe_ignore"):
            return True
        try:
            return bool(self.broker.get_actor(message.actor_name).options.get("pipe_ignore"))
        except ActorNotFound:
            return False

    def state_of(self, workflow_id: str) -> str | None:
        """A workflow's state ("running", ...), None if it does not exist (one HGET)."""
        value = cast("bytes | None", self.broker.client.hget(self.keys.workflow(workflow_id), "state"))
        return None if value is None else value.decode()

    def sweep(self, older_than_ms: int = SWEEP_GRACE_MS) -> int:
        """Send the first steps of workflows whose caller died before it sent them (pending
        longer than ``older_than_ms``). Returns how many workflows it sent for."""
        if not self._sweep_lock.acquire(blocking=False):
            return 0
        try:
            client = self.broker.client
            now = epoch_ms(cast("tuple[int, int]", client.time()))
            stale = cast(
                "list[bytes]", client.zrangebyscore(self.keys.pending, "-inf", now - older_than_ms, start=0, num=100)
            )
            for raw in stale:
                workflow_id = raw.decode()
                outcome, state, _, sends = self.scripts.run(workflow_id)
                if outcome == "again" and state == "running":
                    self.logger.info(
                        "Workflow %s: sending %d first steps its caller did not send.", workflow_id, len(sends)
                    )
                    self.send(sends)
                client.zrem(self.keys.pending, workflow_id)
            return len(stale)
        finally:
            self._sweep_lock.release()

    # -- reading and cancelling -------------------------------------------------------

    def get(self, workflow_id: str) -> WorkflowState | None:
        """A workflow's state and each of its steps' (one ``HGETALL``, and one read of the
        running messages of the queues of its sent steps); None if there is no such
        workflow (never run, or its retention ended)."""
        raw = cast("dict[bytes, bytes]", self.broker.client.hgetall(self.keys.workflow(workflow_id)))
        if not raw or b"state" not in raw:
            return None
        return Reader(workflow_id, {k.decode(): v for k, v in raw.items()}, self._running_ids).state()

    def _running_ids(self, queues: Iterable[str]) -> dict[str, int]:
        """Message id -> when it was fetched, of the messages in flight on ``queues``."""
        found: dict[str, int] = {}
        for queue in sorted(set(queues)):
            try:
                for message in self.broker.running(queue):
                    found[message["message_id"]] = message["fetched_ms"]
            except (ValueError, redis.RedisError):
                continue
        return found

    def list(self, *, state: str | None = None, limit: int = 50) -> list[WorkflowSummary]:
        """The newest workflows first (running ones and finished ones still kept),
        ``state``: only those in it."""
        client = self.broker.client
        out: list[WorkflowSummary] = []
        start = 0
        while len(out) < limit:
            # Newest first, read from the end (ZRANGE, not ZREVRANGE: the ACL rule's command).
            batch = max(limit, 100)
            ids = cast("list[bytes]", client.zrange(self.keys.index, -(start + batch), -(start + 1)))[::-1]
            if not ids:
                break
            start += len(ids)
            with client.pipeline(transaction=False) as pipe:
                for raw in ids:
                    pipe.hmget(self.keys.workflow(raw.decode()), "state", "created", "finished", "steps")
                rows = pipe.execute()
            for raw, (st, created, finished, steps) in zip(ids, rows, strict=True):
                if st is None or (state is not None and st.decode() != state):
                    continue
                out.append(
                    WorkflowSummary(
                        raw.decode(),
                        st.decode(),
                        int(created),
                        int(finished) if finished else None,
                        int(steps or 0),
                    )
                )
                if len(out) == limit:
                    break
        return out

    def cancel(self, workflow_id: str) -> bool:
        """Cancel a running workflow: steps that have not started never run (scheduled
        ones leave their delayed queue; queued ones are skipped when they come), and
        nothing after the running ones is sent. Returns False if it had finished.

        Raises:
          LookupError: No such workflow.
        """
        outcome, _ = self.scripts.cancel(workflow_id, self.retention_ms)
        if outcome == "gone":
            raise LookupError(f"workflow {workflow_id} does not exist (never run, or its retention ended)")
        if outcome != "cancelled":
            return False
        self._notify("cancelled")
        state = self.get(workflow_id)
        for step in state.steps if state is not None else ():
            if step.state == "cancelled" and step.sent_ms is not None and step.delay_ms:
                try:
                    self.broker.delayed_queue(step.queue).remove(step.message_id)
                except (ValueError, redis.RedisError) as e:
                    self.logger.warning(
                        "Workflow %s: step %s stays scheduled (%s); it is skipped when it comes.",
                        workflow_id,
                        step.path,
                        e,
                    )
        return True

    def _notify(self, event: str) -> None:
        for listener in self.listeners:
            try:
                listener(event)
            except Exception:
                self.logger.exception("Workflow listener %r failed.", listener)
