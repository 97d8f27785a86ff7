"""A workflow's state worked out from its HASH (see :mod:`._store`): which steps were sent
comes from the records (a step is sent when what comes before it finished)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Any

from dramatiq.message import Message

from ._compose import OPTION
from ._states import NodeState, StepState, WorkflowState


class Reader:
    """A workflow's state, worked out from its HASH (see the module)."""

    def __init__(self, workflow_id: str, fields: dict[str, bytes], running: Callable[[Iterable[str]], dict[str, int]]):
        self.id = workflow_id
        self.fields = fields
        self.running = running
        self.state_name = fields["state"].decode()
        self.steps: list[StepState] = []
        self._pending: list[tuple[str, Message[Any], int | None, tuple[bool, int, int, str] | None]] = []

    def _done(self, number: int) -> tuple[bool, int, int, str] | None:
        value = self.fields.get(f"d:{number}")
        if value is None:
            return None
        ok, finished, took, result = value.decode().split("|", 3)
        return ok == "1", int(finished), int(took or 0), result

    def state(self) -> WorkflowState:
        created = int(self.fields["created"])
        finished = int(self.fields["finished"]) if "finished" in self.fields else None
        root_spec = self.fields["root"].decode()
        tree = self._node(root_spec, created, "")
        running = self.running(message.queue_name for _, message, *_ in self._pending)
        steps = [self._step(*pending, running) for pending in self._pending]
        tree = _fill(tree, {step.path: step for step in steps})
        root_done = self._done(int(root_spec[1:]))
        result = json.loads(root_done[3]) if root_done and root_done[0] else None
        return WorkflowState(
            self.id, self.state_name, created, finished, tuple(sorted(steps, key=_path_key)), tree, result
        )

    def _node(self, spec: str, sent: int | None, path: str) -> NodeState:
        """The node ``spec``, sent (activated) at ``sent`` (None: not yet)."""
        kind, number = spec[0], int(spec[1:])
        done = self._done(number)
        if kind == "m":
            message = Message.decode(self.fields[f"m:{number}"])
            nav = message.options.get(OPTION, {})
            self._pending.append((nav.get("path", path or "0"), message, sent, done))
            return NodeState("step", nav.get("path", path or "0"), "")
        definition = json.loads(self.fields[f"n:{number}"])
        children: list[NodeState] = []
        if kind == "c":
            child_sent = sent
            for i, child in enumerate(definition["c"]):
                children.append(self._node(child, child_sent, f"{path}.{i}" if path else str(i)))
                child_done = self._done(int(child[1:]))
                child_sent = child_done[1] if child_done and child_done[0] else None
        else:
            for i, child in enumerate(definition["c"]):
                children.append(self._node(child, sent, f"{path}.{i}" if path else str(i)))
        if done is not None:
            state = "done" if done[0] else "failed"
        elif sent is not None and self.state_name == "running":
            state = "running"
        else:
            state = self._never(sent)
        return NodeState(
            "chain" if kind == "c" else "group",
            path,
            state,
            children=tuple(children),
            on_failure=definition.get("f"),
            finished_ms=done[1] if done else None,
        )

    def _never(self, sent: int | None) -> str:
        """The state of a node that has not finished, in a workflow that is not running
        or that has not reached it."""
        if self.state_name == "cancelled":
            return "cancelled"
        if self.state_name == "running":
            return "waiting"
        return "skipped" if sent is None else "sent"

    def _step(
        self,
        path: str,
        message: Message[Any],
        sent: int | None,
        done: tuple[bool, int, int, str] | None,
        running: dict[str, int],
    ) -> StepState:
        delay = message.options.get("delay")
        started = None
        result = None
        if done is not None:
            state = "done" if done[0] else "failed"
            started = done[1] - done[2]
            result = json.loads(done[3]) if done[0] else None
        elif sent is not None and message.message_id in running:
            state = "running" if self.state_name != "cancelled" else "cancelled"
            started = running[message.message_id]
        elif sent is not None and self.state_name in ("running", "failed"):
            state = "sent"
        else:
            state = self._never(sent)
        return StepState(
            path=path,
            actor=message.actor_name,
            queue=message.queue_name,
            message_id=message.message_id,
            state=state,
            sent_ms=sent,
            started_ms=started,
            finished_ms=done[1] if done else None,
            result=result,
            delay_ms=int(delay) if delay else None,
        )


def _fill(node: NodeState, steps: dict[str, StepState]) -> NodeState:
    if node.kind == "step":
        step = steps[node.path]
        return NodeState("step", node.path, step.state, step=step, finished_ms=step.finished_ms)
    return NodeState(
        node.kind,
        node.path,
        node.state,
        children=tuple(_fill(child, steps) for child in node.children),
        on_failure=node.on_failure,
        finished_ms=node.finished_ms,
    )


def _path_key(step: StepState) -> tuple[int, ...]:
    return tuple(int(part) for part in step.path.split("."))
