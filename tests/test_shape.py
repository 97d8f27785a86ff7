"""The architecture stays easy to see (issue 20): no import cycle inside the package at run
time (imports inside functions and ``importlib.import_module("...")`` count,
``TYPE_CHECKING`` imports do not), the dashboard never
imports the CLI, each part reads only what its host Protocol names (issue 34), every key
name is written in ``_keys.py`` alone, and a
warning lists the modules, classes and functions past the sizes a reader holds at once
(sizes are not goals: nothing fails on size).

Read from the source with ``ast``: nothing is imported, so a cycle that Python would
tolerate (a late import inside a function) is still found.
"""

from __future__ import annotations

import ast
import re
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "dramatiq_redisson"

MAX_MODULE_LINES = 800
MAX_CLASS_LINES = 600
MAX_FUNCTION_LINES = 120


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def type_checking_nodes(tree: ast.Module) -> set[int]:
    hidden: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            hidden.update(id(child) for child in ast.walk(node))
    return hidden


def imports_of(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The package's modules that ``name`` imports at run time."""
    tree = ast.parse(path.read_text())
    hidden = type_checking_nodes(tree)
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in hidden:
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            for alias in node.names:
                submodule = f"{source}.{alias.name}"
                found.add(submodule if submodule in known else source)
        elif (
            isinstance(node, ast.Call)
            and ast.unparse(node.func) in ("importlib.import_module", "import_module")
            and node.args
            and isinstance(node.args[0], ast.Constant)
        ):
            found.add(str(node.args[0].value))
    return {module for module in found if module in known and module != name}


def import_graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports_of(name, path, known) for name, path in known.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in sorted(graph[node]):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                other = stack.pop()
                on_stack.discard(other)
                component.append(other)
                if other == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_graph_reader_sees_imports_inside_functions() -> None:
    # The reader itself must be able to fail: the CLI loads the dashboard only inside a
    # command's handler, and the package imports the broker at its top.
    graph = import_graph()
    assert any(dep.startswith("dramatiq_redisson.dashboard") for dep in graph["dramatiq_redisson.cli._serve"])
    assert "dramatiq_redisson._broker" in graph["dramatiq_redisson"]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycle_inside_the_package() -> None:
    assert cycles(import_graph()) == []


def test_the_dashboard_never_imports_the_cli() -> None:
    graph = import_graph()
    offenders = {
        name: sorted(dep for dep in deps if dep.startswith("dramatiq_redisson.cli"))
        for name, deps in graph.items()
        if name.startswith("dramatiq_redisson.dashboard")
    }
    assert {name: deps for name, deps in offenders.items() if deps} == {}


@pytest.mark.parametrize("root", ["dramatiq_redisson", "benchmarks"])
def test_the_largest_units_are_listed_never_limited(root: str) -> None:
    """Sizes are not goals (issue 34): a split is right where a responsibility separates.
    A warning lists the units past the sizes a reader holds at once, and the largest
    module, class and function; nothing fails on size."""
    units: dict[str, list[tuple[int, str]]] = {"module": [], "class": [], "function": []}
    for path in sorted((ROOT / root).rglob("*.py")):
        text = path.read_text()
        where = path.relative_to(ROOT)
        units["module"].append((text.count("\n"), str(where)))
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                size = (node.end_lineno or node.lineno) - node.lineno + 1
                kind = "class" if isinstance(node, ast.ClassDef) else "function"
                units[kind].append((size, f"{where}: {node.name}"))
    limits = {"module": MAX_MODULE_LINES, "class": MAX_CLASS_LINES, "function": MAX_FUNCTION_LINES}
    assert all(units.values()), "the walk found no units: the listing would say nothing"
    over = [
        f"{kind} {name} ({size} lines)" for kind, found in units.items() for size, name in found if size > limits[kind]
    ]
    largest = [f"{kind} {max(found)[1]} ({max(found)[0]} lines)" for kind, found in units.items()]
    if over:
        warnings.warn(f"past the reading sizes {limits}: {over}; largest: {largest}", stacklevel=1)


def _host_reads(source: str, attribute: str) -> set[str]:
    """The names read or written as ``self.<attribute>.<name>`` (or ``<attribute>.<name>``,
    a local of that name) in ``source``."""
    names = set()
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Attribute):
            continue
        value = node.value
        if (
            isinstance(value, ast.Attribute)
            and value.attr == attribute
            and isinstance(value.value, ast.Name)
            and value.value.id == "self"
        ) or (isinstance(value, ast.Name) and value.id == attribute):
            names.add(node.attr)
    return names


def _protocol_members(protocol: type) -> set[str]:
    return {name for name in vars(protocol) if not name.startswith("_")} | set(protocol.__annotations__)


#: Each part, the name it holds its host by, and the Protocol of what it may read of it
#: (issue 34: parts take what they use, and no part reaches into another's privates).
_PARTS = [
    ("_consumer", "broker", "_consumer", "ConsumerHost"),
    ("_transfer_duty", "host", "_transfer_duty", "DutyHost"),
    ("_transfer_duty", "sink", "_transfer_duty", "Sink"),
    ("_subscription", "host", "_subscription", "SubscriptionHost"),
    ("_upkeep", "host", "_upkeep", "UpkeepHost"),
    ("_start_gate", "broker", "_start_gate", "GateHost"),
    ("sharding._consumer", "broker", "sharding._consumer", "ShardedHost"),
    ("sharding._shards", "broker", "sharding._shards", "RouterHost"),
    ("_producer", "host", "_producer", "ProducerHost"),
    ("_liveness", "broker", "_liveness", "LivenessHost"),
    ("periodic._schedules", "broker", "periodic._schedules", "PeriodicHost"),
    ("admin._dead_letters", "broker", "scripts._calls", "ScriptsHost"),
    ("admin._delayed_queue", "broker", "scripts._calls", "ScriptsHost"),
    ("admin._queue_admin", "host", "admin._queue_admin", "AdminHost"),
    ("admin._message_state", "host", "admin._message_state", "StateHost"),
]


@pytest.mark.parametrize(("module", "attribute", "home", "protocol"), _PARTS)
def test_each_part_reads_only_what_its_host_protocol_names(
    module: str, attribute: str, home: str, protocol: str
) -> None:
    import importlib

    declared = _protocol_members(getattr(importlib.import_module(f"dramatiq_redisson.{home}"), protocol))
    read = _host_reads((PACKAGE / f"{module.replace('.', '/')}.py").read_text(), attribute)
    assert read, f"{module} reads nothing through {attribute}: the check would pass vacuously"
    assert read <= declared, f"{module} reads {sorted(read - declared)} of its {attribute}, not in {protocol}"
    assert not any(name.startswith("_") for name in declared)


def test_the_broker_is_every_host_its_parts_take() -> None:
    """At run time too (mypy checks the types): the broker has every member of every
    host Protocol, once built."""
    import importlib

    from dramatiq_redisson import RedissonBroker

    broker = RedissonBroker(host="127.0.0.1", port=1, middleware=[])
    try:
        for _, _, home, protocol in _PARTS:
            if protocol == "Sink":  # the consumer, as its transfer duty sees it
                continue
            members = _protocol_members(getattr(importlib.import_module(f"dramatiq_redisson.{home}"), protocol))
            missing = [name for name in members if not hasattr(broker, name)]
            assert missing == [], (protocol, missing)
    finally:
        broker.close()


def test_the_read_and_admin_side_reads_only_what_its_host_protocol_names() -> None:
    """QueueAdmin (issue 34) takes the broker as an ``AdminHost``: every broker member it
    reads is one the protocol declares, and the broker's methods of its names are
    delegates that carry its documentation."""
    from dramatiq_redisson import RedissonBroker
    from dramatiq_redisson.admin._queue_admin import AdminHost, QueueAdmin

    source = (PACKAGE / "admin" / "_queue_admin.py").read_text()
    read = _host_reads(source, "host")
    assert read and read <= _protocol_members(AdminHost), sorted(read - _protocol_members(AdminHost))
    for name in ("known_queues", "stats", "history", "running", "pause", "resume", "flush"):
        assert getattr(RedissonBroker, name).__doc__ == getattr(QueueAdmin, name).__doc__
        assert getattr(QueueAdmin, name).__doc__


#: What only a key's name contains: Redisson's prefix, Dramatiq's ack and heartbeat keys, and
#: a queue's suffixes (``.DQ``, ``.XQ``, ``.msgs``) at the start of a string joined to its name.
_KEY_NAME = re.compile(r"redisson_delay_queue_|__acks__|__heartbeats__|^\.(?:DQ|XQ|msgs)\b")


def _docstrings(tree: ast.Module) -> set[int]:
    found: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                found.add(id(body[0].value))
    return found


def test_every_key_name_is_written_in_the_keys_module_alone() -> None:
    """A key named outside ``_keys.py`` is a key a cluster layout, the ACL rule or a sharded
    queue would miss (strings in code; docstrings and comments may name keys)."""
    outside: list[str] = []
    for name, path in modules().items():
        if name == "dramatiq_redisson._keys":
            continue
        tree = ast.parse(path.read_text())
        docstrings = _docstrings(tree)
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and id(node) not in docstrings
                and _KEY_NAME.search(node.value)
            ):
                outside.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value!r}")
    assert not outside, "key names outside _keys.py:\n" + "\n".join(outside)


def test_the_key_name_check_sees_a_key_in_a_string_or_an_f_string() -> None:
    assert _KEY_NAME.search("redisson_delay_queue_timeout:{x}")
    assert _KEY_NAME.search(".msgs")
    assert _KEY_NAME.search(ast.parse('f"{ns}:__acks__.{w}"').body[0].value.values[1].value)  # type: ignore[attr-defined]
    assert not _KEY_NAME.search("Messages still in the built-in broker's .DQ delay queue")
