"""What :meth:`Workflows.get <dramatiq_redisson.workflows.Workflows.get>` and
:meth:`~dramatiq_redisson.workflows.Workflows.list` return, and the handle ``.run()`` returns."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

#: A workflow's states; a step's add "waiting" (not sent yet), "sent" (queued,
#: scheduled or running), "running", "skipped" (never sent: something before it failed)
#: and "cancelled" (never sent, or sent and skipped when it came, after a cancel).
WorkflowStateName = Literal["running", "done", "failed", "cancelled"]


@dataclass(frozen=True)
class StepState:
    """One step of a workflow, as :meth:`Workflows.get` found it."""

    #: Its place: "1.0" is the first member of the root's second node.
    path: str
    actor: str
    queue: str
    message_id: str
    #: "waiting", "sent", "running", "done", "failed", "skipped" or "cancelled".
    state: str
    #: When it was sent, started and finished (epoch ms, server clock), or None.
    sent_ms: int | None = None
    started_ms: int | None = None
    finished_ms: int | None = None
    #: Its result (decoded JSON) once done; None before.
    result: Any = None
    #: Its delay (ms) from when it is sent, or None.
    delay_ms: int | None = None


@dataclass(frozen=True)
class NodeState:
    """A node of the tree: a step, or a chain or group with its members."""

    kind: Literal["step", "chain", "group"]
    path: str
    state: str
    step: StepState | None = None
    children: tuple[NodeState, ...] = ()
    on_failure: str | None = None
    finished_ms: int | None = None

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind, "path": self.path, "state": self.state}
        if self.step is not None:
            out["step"] = self.step.__dict__.copy()
        if self.on_failure is not None:
            out["on_failure"] = self.on_failure
        if self.children:
            out["children"] = [child.as_dict() for child in self.children]
        return out


@dataclass(frozen=True)
class WorkflowState:
    """A workflow as :meth:`Workflows.get` found it."""

    id: str
    #: "running", "done", "failed" or "cancelled".
    state: str
    created_ms: int
    finished_ms: int | None
    #: Every step, in path order.
    steps: tuple[StepState, ...]
    #: The tree of chains, groups and steps.
    tree: NodeState
    #: The workflow's result (its root's: a chain's last step's, a group's list) once done.
    result: Any = None

    @property
    def finished(self) -> bool:
        return self.state != "running"

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "state": self.state,
            "created_ms": self.created_ms,
            "finished_ms": self.finished_ms,
            "result": self.result,
            "steps": [step.__dict__.copy() for step in self.steps],
            "tree": self.tree.as_dict(),
        }


@dataclass(frozen=True)
class WorkflowSummary:
    """A line of :meth:`Workflows.list`."""

    id: str
    state: str
    created_ms: int
    finished_ms: int | None
    steps: int


class WorkflowReader(Protocol):
    """What a :class:`Workflow` handle asks of its broker's workflows."""

    def get(self, workflow_id: str) -> WorkflowState | None: ...

    def cancel(self, workflow_id: str) -> bool: ...


@runtime_checkable
class WorkflowRunner(Protocol):
    """What ``.run()`` asks of a broker's ``workflows``."""

    def run(self, root: Any) -> Workflow: ...


@dataclass
class Workflow:
    """A workflow that was run: its ``id``, and shortcuts to its broker's workflows."""

    id: str
    workflows: WorkflowReader = field(repr=False)

    def get(self) -> WorkflowState | None:
        return self.workflows.get(self.id)

    def cancel(self) -> bool:
        return self.workflows.cancel(self.id)

    def wait(self, timeout: float = 60.0, interval: float = 0.05) -> WorkflowState:
        """Wait until the workflow has finished (done, failed or cancelled) and return its
        state.

        Raises:
          TimeoutError: Still running after ``timeout`` s.
          LookupError: It no longer exists (its retention ended).
        """
        deadline = time.monotonic() + timeout
        while True:
            state = self.get()
            if state is None:
                raise LookupError(f"workflow {self.id} does not exist (never run, or its retention ended)")
            if state.finished:
                return state
            if time.monotonic() >= deadline:
                raise TimeoutError(f"workflow {self.id} still {state.state} after {timeout} s")
            time.sleep(interval)
