"""The workflow scripts (``lua/``), each behind one typed wrapper.

Every key of a workflow is in one hash slot, ``{<ns>:__workflows__}`` (a cluster keeps
all of a namespace's workflows on the master of that slot, as BullMQ's flows keep theirs
under one prefix), so each script is atomic on a cluster too; the steps themselves go
to their queues, on any slot, through the broker's own sends.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

from ..connection._topology import Topology
from ..scripts._contract import Contract, parse_contract
from ..scripts._runner import ScriptRunner

_NAMES = ("run", "step", "cancel")


def _read(name: str) -> str:
    return resources.files(__package__).joinpath("lua").joinpath(f"{name}.lua").read_text(encoding="utf-8")


@functools.cache
def contract(name: str) -> Contract:
    """The contract (ARGV by name) of ``lua/<name>.lua``, read from its header once."""
    return parse_contract(_read(name), f"workflows/{name}")


def _source(name: str) -> bytes:
    """A script's text with the shared functions (``lib.lua``) written in front of it."""
    return (_read("lib") + "\n" + _read(name)).encode()


_SOURCES = {name: _source(name) for name in _NAMES}


@dataclass(frozen=True)
class WorkflowKeys:
    """The keys of a namespace's workflows; all in the slot of ``{<ns>:__workflows__}``."""

    namespace: str

    @functools.cached_property
    def prefix(self) -> str:
        return f"{self.namespace}:__workflows__.{{{self.namespace}:__workflows__}}"

    def workflow(self, workflow_id: str) -> str:
        """HASH: one workflow's nodes, records and state (``lua/lib.lua``)."""
        return f"{self.prefix}.w:{workflow_id}"

    @property
    def index(self) -> str:
        """ZSET: workflow id -> when it started (epoch ms, server clock)."""
        return f"{self.prefix}.index"

    @property
    def pending(self) -> str:
        """ZSET: workflow id -> when it started, until its first steps were sent."""
        return f"{self.prefix}.pending"

    @property
    def finished(self) -> str:
        """ZSET: workflow id -> when it finished, until its retention ends."""
        return f"{self.prefix}.finished"

    def of(self, workflow_id: str) -> list[str]:
        """The KEYS of every workflow script, in their headers' order."""
        return [self.workflow(workflow_id), self.index, self.pending, self.finished]


#: A step to send: its spec ("m5"), its encoded message and its input (JSON, "": none).
Send = tuple[str, bytes, str]


def _sends(reply: Sequence[Any], start: int) -> list[Send]:
    return [(_text(reply[i]), reply[i + 1], _text(reply[i + 2])) for i in range(start, len(reply) - 2, 3)]


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class WorkflowScripts(ScriptRunner):
    """The workflow scripts on one client (see the module)."""

    def __init__(self, client: Any, topology: Topology, keys: WorkflowKeys) -> None:
        super().__init__(client, _SOURCES, topology=topology)
        self.keys = keys

    def run(
        self, workflow_id: str, root: str | None = None, steps: int = 0, fields: Sequence[Any] = ()
    ) -> tuple[str, str, int, list[Send]]:
        """Record a workflow (``root`` given) or replay a recorded one's first steps:
        the outcome ("recorded", "again", "gone"), its state, when it started and the
        steps to send (run.lua)."""
        given: dict[str, Any] = {"id": workflow_id}
        if root is not None:
            given |= {"root": root, "steps": steps, "nodes": fields}
        reply = self._run_idempotent("run", self.keys.of(workflow_id), contract("run").argv(**given))
        return _text(reply[0]), _text(reply[1]), int(reply[2]), _sends(reply, 3)

    def step(
        self,
        workflow_id: str,
        node: int,
        ok: bool,
        result: str,
        took_ms: int,
        parent: int,
        parent_kind: str,
        following: str,
        retention_ms: int,
        now_ms: str = "",
    ) -> tuple[str, str, list[Send]]:
        """Record a finished step: the outcome ("recorded", "again", "gone"), the
        workflow's end state if this ended it ("" else) and the steps to send (step.lua)."""
        reply = self._run_idempotent(
            "step",
            self.keys.of(workflow_id),
            contract("step").argv(
                id=workflow_id,
                node=node,
                ok="1" if ok else "0",
                result=result,
                took=took_ms,
                parent=parent,
                parent_kind=parent_kind,
                following=following,
                retention=retention_ms,
                now=now_ms,
            ),
        )
        return _text(reply[0]), _text(reply[1]), _sends(reply, 2)

    def cancel(self, workflow_id: str, retention_ms: int) -> tuple[str, str]:
        """Cancel a running workflow: ("cancelled" | "finished" | "gone", its state)."""
        reply = self._run_idempotent(
            "cancel", self.keys.of(workflow_id), contract("cancel").argv(id=workflow_id, retention=retention_ms)
        )
        return _text(reply[0]), _text(reply[1])
