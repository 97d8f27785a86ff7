"""A workflow's shape: :class:`chain` and :class:`group`, nested to any depth, and their
compilation into the nodes the server keeps (see ``lua/lib.lua`` for the fields).

Nodes are numbered in preorder, the root 0. A step (a Dramatiq message) is stored as
the message it will be sent as: a fresh message id per run, and the option
``workflow`` that tells the worker which step it is (:class:`Nav`); a chain or a group
as a small JSON object. Nothing here talks to the server.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal, TypedDict, Union, cast

import dramatiq
from dramatiq.message import Message

from ._states import Workflow, WorkflowRunner

#: The message option that carries a step's place in its workflow.
OPTION = "workflow"

#: What a group does when one of its members failed for good.
FAILURE_POLICIES = ("fail", "continue")

Step = Union[Message[Any], "chain", "group"]


class Nav(TypedDict):
    """A step's place in its workflow, in its message's ``workflow`` option."""

    #: The workflow's id.
    id: str
    #: The step's node number.
    n: int
    #: Its path, for people: "1.0" is the first member of the root's second node.
    path: str
    #: Its parent's node number (-1: the workflow is this one step) and kind ("c", "g", "").
    p: int
    pk: str
    #: The spec ("m5", "g7") of the node after it in its chain, or "".
    next: str


def _check_step(step: object, where: str) -> None:
    if not isinstance(step, Message | chain | group):
        raise TypeError(
            f"{where}: a step is a message (actor.message(...), actor.message_with_options(...)), "
            f"a chain or a group, not {type(step).__name__}: {step!r}"
        )
    if isinstance(step, Message) and OPTION in step.options:
        raise ValueError(
            f"{where}: message {step.message_id} is a step of workflow {step.options[OPTION]['id']} already"
        )


class _Composite:
    kind: Literal["c", "g"]
    steps: tuple[Step, ...]

    def run(self, *, broker: Any = None) -> Workflow:
        """Record the workflow on the server and send its first steps (see
        :meth:`dramatiq_redisson.workflows.Workflows.run`); ``broker``: the broker whose
        server keeps it, by default Dramatiq's global broker."""
        if broker is None:
            import dramatiq

            broker = dramatiq.get_broker()
        workflows = getattr(broker, "workflows", None)
        if not isinstance(workflows, WorkflowRunner):
            raise TypeError(
                f"workflows run on a RedissonBroker, whose server keeps their state; the broker is "
                f"{type(broker).__name__}"
            )
        return workflows.run(cast("Step", self))

    def __len__(self) -> int:
        return len(self.steps)

    def __iter__(self) -> Any:
        return iter(self.steps)


class chain(_Composite):  # noqa: N801 (named as Dramatiq's pipeline and group are)
    """Steps run one after another: each starts when the one before it has succeeded
    (after its retries), with that one's result appended to its arguments unless it has
    ``pipe_ignore=True`` (as in Dramatiq's ``pipeline``). A chain's result is its last
    step's. One step that fails for good fails the chain."""

    kind = "c"

    def __init__(self, *steps: Step) -> None:
        if len(steps) == 1 and isinstance(steps[0], list | tuple):
            steps = tuple(steps[0])
        if not steps:
            raise ValueError("chain(): a chain needs at least one step")
        for i, step in enumerate(steps):
            _check_step(step, f"chain step {i}")
        self.steps = tuple(steps)

    def __repr__(self) -> str:
        return f"chain({', '.join(map(_describe, self.steps))})"


class group(_Composite):  # noqa: N801
    """Steps run side by side, each given the result of the step before the group. The
    group finishes when every member has finished (succeeded, or failed for good); its
    result, passed to the step after it as one argument, is the list of its members'
    results in member order.

    ``on_failure``: ``"fail"`` (the default): a member that failed fails the group, and
    nothing after it runs; ``"continue"``: the group succeeds with ``None`` in the failed
    members' places."""

    kind = "g"

    def __init__(self, steps: Iterable[Step], *, on_failure: str = "fail") -> None:
        if isinstance(steps, Message | chain | group):
            raise TypeError("group(): pass the members as one list: group([a, b, c])")
        members = tuple(steps)
        if not members:
            raise ValueError("group(): a group needs at least one member")
        if on_failure not in FAILURE_POLICIES:
            raise ValueError(f"group(): on_failure is one of {FAILURE_POLICIES}, not {on_failure!r}")
        for i, step in enumerate(members):
            _check_step(step, f"group member {i}")
        self.steps = members
        self.on_failure = on_failure

    def __repr__(self) -> str:
        return f"group([{', '.join(map(_describe, self.steps))}], on_failure={self.on_failure!r})"


def _describe(step: Step) -> str:
    return f"{step.actor_name}(...)" if isinstance(step, Message) else repr(step)


@dataclass(frozen=True)
class Compiled:
    """A workflow ready to record: its id, its root's spec, how many steps, and the
    hash fields (``lua/lib.lua``) to write."""

    id: str
    root: str
    steps: int
    fields: dict[str, bytes | str | int]
    #: The steps that start the workflow, as they are sent.
    first: list[Message[Any]]


def spec(kind: str, number: int) -> str:
    return f"{kind}{number}"


def compile_workflow(root: Step, workflow_id: str | None = None) -> Compiled:
    """Number the nodes of ``root`` and make the fields the server keeps.

    Raises:
      ValueError: A message object used twice in one workflow.
    """
    workflow_id = workflow_id or str(uuid.uuid4())
    defs: dict[int, dict[str, Any]] = {}  # chains and groups
    leaves: dict[int, tuple[Message[Any], int, str, str]] = {}  # message, parent, its kind, path
    seen: set[int] = set()

    def visit(node: Step, parent: int, parent_kind: str, path: str) -> str:
        number = len(defs) + len(leaves)
        if isinstance(node, Message):
            if id(node) in seen:
                raise ValueError(f"step {path or '0'}: the same message object is used twice in one workflow")
            seen.add(id(node))
            leaves[number] = (node, parent, parent_kind, path or "0")
            return spec("m", number)
        definition: dict[str, Any] = {"k": node.kind, "p": parent, "pk": parent_kind, "n": "", "c": []}
        if isinstance(node, group):
            definition["f"] = node.on_failure
        defs[number] = definition
        definition["c"] = [
            visit(child, number, node.kind, f"{path}.{i}" if path else str(i)) for i, child in enumerate(node.steps)
        ]
        return spec(node.kind, number)

    root_spec = visit(root, -1, "", "")

    # The node after each one in its chain.
    following: dict[int, str] = {}
    for definition in defs.values():
        if definition["k"] == "c":
            for before, after in zip(definition["c"], definition["c"][1:], strict=False):
                following[int(before[1:])] = after

    fields: dict[str, bytes | str | int] = {}
    for number, definition in defs.items():
        definition["n"] = following.get(number, "")
        fields[f"n:{number}"] = json.dumps(definition, separators=(",", ":"))
        if definition["k"] == "g":
            fields[f"c:{number}"] = len(definition["c"])
    encoder = dramatiq.get_encoder()
    first = set(_first(root_spec, defs))
    sent: dict[int, Message[Any]] = {}
    # Each step's message id: the run's random base plus its node number (a UUID still).
    base = uuid.uuid4().int & ~0xFFFFFFFF
    for number, (message, parent, parent_kind, path) in leaves.items():
        nav: Nav = {
            "id": workflow_id,
            "n": number,
            "path": path,
            "p": parent,
            "pk": parent_kind,
            "next": following.get(number, ""),
        }
        data = message.asdict()
        data["message_id"] = str(uuid.UUID(int=base | number))
        data["options"] = {**message.options, OPTION: nav}
        fields[f"m:{number}"] = encoder.encode(data)
        if number in first:
            sent[number] = Message(**data)
    return Compiled(workflow_id, root_spec, len(leaves), fields, [sent[n] for n in _first(root_spec, defs)])


def _first(node: str, defs: dict[int, dict[str, Any]]) -> list[int]:
    """The steps that run first when ``node`` starts: itself, a chain's first node's, every
    member's of a group (``lua/lib.lua``'s ``wf_start``)."""
    number = int(node[1:])
    if node[0] == "m":
        return [number]
    children = defs[number]["c"]
    if node[0] == "c":
        return _first(children[0], defs)
    return [step for child in children for step in _first(child, defs)]
