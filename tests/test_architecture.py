"""Architecture measurements of issue 48, read from the source with ``ast`` (nothing of the
package is imported) whatever the layout: ``dramatiq_redisson/**/*.py`` and ``benchmarks/**/*.py``
are walked; module paths are named only in the table below. 1. reach (members of what a class
was given, <= 12); 2. private accesses (<= 4); 3. single-vs-cluster branches (<= 20, in the
topology package); 4. import cycles, ``TYPE_CHECKING`` included (none); 5. package directions.

``python -m tests.test_architecture [ROOT [ROOT2]]``: the measurements of one checkout
(default: this one), or of two side by side (before, after).
"""

from __future__ import annotations

import ast
import re
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.test_shape import cycles

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "dramatiq_redisson"
BENCHMARKS = "benchmarks"

# -- the only module paths named here -------------------------------------------------
TOPOLOGY_PACKAGE = "dramatiq_redisson.connection"  # owns single-server vs cluster
SHARDING = "dramatiq_redisson.sharding"
ADMIN = "dramatiq_redisson.admin"
DELIVERY_PATH = {"_producer", "_consumer", "_pacing", "_transfer_duty", "_timer", "_liveness"}  # last component
OUTER_PARTS = ("dramatiq_redisson.metrics", "dramatiq_redisson.cli", "dramatiq_redisson.dashboard")
CLI = "dramatiq_redisson.cli"
MAIN = "dramatiq_redisson.__main__"

MAX_REACH, MAX_PRIVATE, MAX_CLUSTER_BRANCHES = 12, 4, 20

Sources = dict[str, str]  # posix path relative to the root -> source text


def read_sources(root: Path, top: str = PACKAGE) -> Sources:
    return {p.relative_to(root).as_posix(): p.read_text() for p in sorted((root / top).rglob("*.py"))}


def module_of(path: str) -> str:
    parts = path.removesuffix(".py").split("/")
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _dotted(node: ast.expr) -> str:
    return ast.unparse(node) if isinstance(node, ast.Name | ast.Attribute) else ""


# -- 1. reach ----------------------------------------------------------------------------
_SETTINGS = re.compile(r"settings|options|config|tuning", re.IGNORECASE)
_PLAIN = {"str", "int", "float", "bool", "bytes", "None"}


def _is_plain(annotation: ast.expr | None) -> bool:
    if annotation is None:
        return False
    text = ast.unparse(annotation).strip("'\"")
    return "Callable" in text or set(re.findall(r"\w+", text)) <= _PLAIN


def _is_settings(name: str, annotation: ast.expr | None = None) -> bool:
    typed = annotation is not None and re.search(r"\w+(Settings|Options)\b", ast.unparse(annotation))
    return bool(_SETTINGS.search(name) or typed)


def _self_attr(node: ast.expr) -> str:
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
        return node.attr
    return ""


def class_reach(cls: ast.ClassDef) -> dict[str, set[str]]:
    """Given object (``param``, or ``param.attr`` stored from it) -> the member names the
    class reads of it: ``self.x.NAME`` anywhere, ``local.NAME`` after ``local = self.x`` in
    a method (one level of aliasing), ``param.NAME`` in ``__init__``. Settings and
    options objects, plain values and callables are not counted."""
    init = next((f for f in cls.body if isinstance(f, ast.FunctionDef) and f.name == "__init__"), None)
    if init is None:
        return {}
    args = init.args.posonlyargs[1:] + init.args.args[1:] + init.args.kwonlyargs
    called = {n.func.id for n in ast.walk(init) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    params = {
        a.arg for a in args if not (_is_plain(a.annotation) or _is_settings(a.arg, a.annotation) or a.arg in called)
    }
    stored: dict[str, str] = {}  # self attribute -> the given object it holds
    for node in ast.walk(init):
        if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            value, plain = node.value, isinstance(node, ast.AnnAssign) and _is_plain(node.annotation)
            for attr in filter(None, map(_self_attr, targets)):
                if isinstance(value, ast.Name) and value.id in params:
                    stored[attr] = value.id
                elif isinstance(value, ast.Attribute) and _dotted(value.value) in params:
                    if not (plain or _is_settings(value.attr)):
                        stored[attr] = _dotted(value)
    found: dict[str, set[str]] = {}

    def read(owner: str, name: str) -> None:
        if not _is_settings(name):
            found.setdefault(owner, set()).add(name)

    for node in ast.walk(init):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in params:
            read(node.value.id, node.attr)
    for method in (f for f in cls.body if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)):
        aliases = {
            n.targets[0].id: stored[attr]
            for n in ast.walk(method)
            if isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name)
            if (attr := _self_attr(n.value)) in stored and method is not init
        }
        for node in ast.walk(method):
            if isinstance(node, ast.Call) and (attr := _self_attr(node.func)) in stored:
                found.pop(stored.pop(attr), None)  # a callable, called directly
            if not isinstance(node, ast.Attribute):
                continue
            if (attr := _self_attr(node.value)) in stored:
                read(stored[attr], node.attr)
            elif isinstance(node.value, ast.Name) and node.value.id in aliases:
                read(aliases[node.value.id], node.attr)
    return found


def reach(src: Sources) -> dict[str, dict[str, set[str]]]:
    """``path:Class`` -> given object -> member names read (classes reading any)."""
    result = {}
    for path, text in src.items():
        for cls in (n for n in ast.walk(ast.parse(text)) if isinstance(n, ast.ClassDef)):
            if found := class_reach(cls):
                result[f"{path}:{cls.name}"] = found
    return result


def reach_over(src: Sources, limit: int = MAX_REACH) -> dict[str, int]:
    counts = {name: sum(map(len, found.values())) for name, found in reach(src).items()}
    return dict(sorted(((k, n) for k, n in counts.items() if n > limit), key=lambda kv: -kv[1]))


# -- 2. private access -------------------------------------------------------------------
def _module_names(tree: ast.Module, path: str, known: set[str]) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.asname or a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            source = _resolve(node, module_of(path), path.endswith("__init__.py"))
            names.update(a.asname or a.name for a in node.names if f"{source}.{a.name}" in known)
    return names


def private_accesses(src: Sources) -> list[str]:
    """``path:line: x._name`` where ``x`` is not ``self``, ``cls``, ``super()`` or a module
    (the same expression twice on a line is one site)."""
    known = {module_of(p) for p in src}
    sites: dict[str, None] = {}
    for path, text in src.items():
        tree = ast.parse(text)
        modules = _module_names(tree, path, known) | {"self", "cls"}
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Attribute) and re.fullmatch(r"_(?!_)\w*", node.attr)):
                continue
            value = node.value
            if isinstance(value, ast.Name) and value.id in modules:
                continue
            if isinstance(value, ast.Call) and _dotted(value.func) == "super":
                continue
            sites[f"{path}:{node.lineno}: {ast.unparse(node)}"] = None
    return sorted(sites, key=lambda site: (site.split(":")[0], int(site.split(":")[1])))


# -- 3. single-vs-cluster branches ---------------------------------------------------------
_CLUSTER = re.compile(r"cluster", re.IGNORECASE)
CLI_ARGS = "args"  # argparse's namespace: ``args.cluster`` is an option given, not a topology


def _mentions_cluster(test: ast.expr) -> bool:
    for node in ast.walk(test):
        if isinstance(node, ast.Name) and _CLUSTER.search(node.id):
            return True
        if isinstance(node, ast.Attribute) and _CLUSTER.search(node.attr) and _dotted(node.value) != CLI_ARGS:
            return True
    return False


def _tests(tree: ast.Module) -> Iterator[ast.expr]:
    for node in ast.walk(tree):
        if isinstance(node, ast.If | ast.IfExp | ast.While):
            yield node.test  # and/or inside it: one test
        elif isinstance(node, ast.Match):
            yield node.subject
            yield from (case.guard for case in node.cases if case.guard is not None)


def cluster_branches(src: Sources) -> list[str]:
    """``path:line: test`` of every if/elif/ternary/while/match test naming cluster-ness."""
    found = [(path, test) for path, text in src.items() for test in _tests(ast.parse(text)) if _mentions_cluster(test)]
    return [f"{path}:{test.lineno}: {ast.unparse(test)[:60]}" for path, test in sorted(found, key=_place)]


def _place(item: tuple[str, ast.expr]) -> tuple[str, int]:
    return item[0], item[1].lineno


def _outside_topology(sites: list[str]) -> list[str]:
    return [s for s in sites if not _within(module_of(s.split(":")[0]), TOPOLOGY_PACKAGE)]


# -- 4 and 5. imports --------------------------------------------------------------------
def _resolve(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def import_graph(src: Sources) -> dict[str, set[str]]:
    """Module -> the modules of ``src`` it imports: at the top, inside functions, under
    ``TYPE_CHECKING`` and by ``importlib.import_module("...")``."""
    known = {module_of(p) for p in src}
    graph: dict[str, set[str]] = {}
    for path, text in src.items():
        name, found = module_of(path), set[str]()
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Import):
                found.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                source = _resolve(node, name, path.endswith("__init__.py"))
                found.update(f"{source}.{a.name}" if f"{source}.{a.name}" in known else source for a in node.names)
            elif isinstance(node, ast.Call) and _dotted(node.func) in ("importlib.import_module", "import_module"):
                if node.args and isinstance(node.args[0], ast.Constant):
                    found.add(str(node.args[0].value))
        graph[name] = {m for m in found if m in known and m != name}
    return graph


def import_cycles(src: Sources) -> list[list[str]]:
    return cycles(import_graph(src))


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


#: The composition root: it builds every part, sharded ones included (a sharded queue's
#: consumer and views are made here from the feature package), so it may import them.
COMPOSITION_ROOT = "dramatiq_redisson._broker"

#: Packages around the core that are not the core: the feature that composes over the core
#: (sharding) and the parts only the outside reaches (metrics, cli, dashboard), plus the
#: public faces that re-export (``__init__``, ``__main__``) and the optional middleware.
NOT_CORE = (SHARDING, *OUTER_PARTS, "dramatiq_redisson.tracing", "dramatiq_redisson.embedded")


def _core(module: str) -> bool:
    """Every module of the package but the sharding package, the outer parts, the public
    faces (the package's ``__init__``, ``__main__``) and the composition root: the flat
    core and the feature packages it uses (connection, scripts, flow, periodic, admin)."""
    parts = module.split(".")
    if parts[0] != PACKAGE or len(parts) < 2 or module in (COMPOSITION_ROOT, MAIN):
        return False
    return not any(_within(module, other) for other in NOT_CORE)


#: The one import of an outer part from inside, and why: ``RedissonBroker.add_middleware``
#: turns an instance of Dramatiq's own ``Prometheus`` into this package's (docs/metrics.md),
#: and loads ``metrics`` for that only when it is given one; ``metrics`` types the broker
#: with a Protocol of its own, so the edge makes no cycle. Anything else fails.
ADOPTION = (COMPOSITION_ROOT, "dramatiq_redisson.metrics")


def _outer_allowed(importer: str, outer: str) -> bool:
    if (importer, outer) == ADOPTION:
        return True
    return _within(importer, outer) or importer == MAIN or (_within(importer, CLI) and outer != CLI)


#: rule -> (the sub-package it needs, whether importer -> imported breaks it)
DIRECTIONS: dict[str, tuple[str, Callable[[str, str], bool]]] = {
    "core -/-> sharding": (SHARDING, lambda a, b: _core(a) and _within(b, SHARDING)),
    "admin -/-> delivery path": (ADMIN, lambda a, b: _within(a, ADMIN) and b.split(".")[-1] in DELIVERY_PATH),
    "only the CLI reaches metrics/cli/dashboard": (
        "",
        lambda a, b: any(_within(b, o) and not _outer_allowed(a, o) for o in OUTER_PARTS),
    ),
}


def direction_breaks(src: Sources, rule: str) -> list[str] | None:
    """``importer -> imported`` breaking ``rule``; ``None`` while its sub-package is missing."""
    needs, breaks = DIRECTIONS[rule]
    graph = import_graph(src)
    if needs and not any(_within(m, needs) for m in graph):
        return None
    return sorted(f"{a} -> {b}" for a, deps in graph.items() for b in deps if breaks(a, b))


# -- the goals ---------------------------------------------------------------------------


def test_each_class_reaches_at_most_12_members_of_what_it_was_given() -> None:
    assert reach_over(read_sources(ROOT)) == {}


def test_at_most_4_accesses_of_another_objects_privates() -> None:
    sites = private_accesses(read_sources(ROOT))
    assert len(sites) <= MAX_PRIVATE, "\n".join(sites)


def test_at_most_20_cluster_branches_all_in_the_topology_package() -> None:
    sites = cluster_branches(read_sources(ROOT))
    assert len(sites) <= MAX_CLUSTER_BRANCHES, "\n".join(sites)
    assert _outside_topology(sites) == []


@pytest.mark.parametrize("top", [PACKAGE, BENCHMARKS])
def test_no_import_cycle_counting_type_checking_imports(top: str) -> None:
    assert import_cycles(read_sources(ROOT, top)) == []


@pytest.mark.parametrize("rule", list(DIRECTIONS))
def test_package_directions(rule: str) -> None:
    breaks = direction_breaks(read_sources(ROOT), rule)
    if breaks is None:
        pytest.skip(f"{DIRECTIONS[rule][0]} does not exist yet (issue 48 moves the modules there)")
    assert breaks == []


# -- the counters can fail -----------------------------------------------------------------
_SYNTHETIC = """
class Part:
    def __init__(self, host: Host, name: str, settings: Settings, clock: Clock) -> None:
        self.host = host
        self.log = host.logger
        self.name = name
        self.opts = settings
        self.clock = clock
        host.attach(self)

    def run(self) -> None:
        h = self.host
        self.host.a, self.host.b, h.c, self.host.settings.x, self.opts.y, self.name.upper()
        self.log.info(), self.clock()
"""


def test_reach_counts_members_aliases_and_derived_objects_only() -> None:
    found = reach({"m.py": _SYNTHETIC})
    assert found == {"m.py:Part": {"host": {"logger", "attach", "a", "b", "c"}, "host.logger": {"info"}}}
    assert reach_over({"m.py": _SYNTHETIC}, limit=5) == {"m.py:Part": 6}


def test_private_access_skips_self_super_and_modules() -> None:
    src = "import sys\nfrom . import mod\nx = other._a, other._a, self._b, super()._c, sys._d, mod._e, o.__d__, f()._g"
    assert private_accesses({"p/m.py": src, "p/mod.py": ""}) == ["p/m.py:3: other._a", "p/m.py:3: f()._g"]


def test_cluster_branches_are_tests_naming_cluster_ness() -> None:
    src = (
        "if keys.cluster and x:\n    pass\ny = 1 if isinstance(c, RedisCluster) else 2\n"
        "if args.cluster:\n    pass\nf(cluster=True)\nwhile not is_cluster:\n    pass"
    )
    assert [s.split(":")[1] for s in cluster_branches({"pkg/m.py": src})] == ["1", "3", "7"]
    assert _outside_topology([f"{TOPOLOGY_PACKAGE.replace('.', '/')}/_t.py:1: x", "p/m.py:1: x"]) == ["p/m.py:1: x"]


def test_the_import_graph_counts_type_checking_late_and_importlib_imports() -> None:
    src = {
        "p/__init__.py": "from ._a import A",
        "p/_a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ._b import B",
        "p/_b.py": "def f():\n    from . import _c",
        "p/_c.py": "import importlib\nimportlib.import_module('p._a')",
    }
    assert import_graph(src)["p._b"] == {"p._c"}
    assert import_cycles(src) == [["p._a", "p._b", "p._c"]]


def test_the_direction_rules_can_break() -> None:
    pkg = PACKAGE.replace(".", "/")
    src = {
        f"{pkg}/__init__.py": "",
        f"{pkg}/__main__.py": "from .cli import main",
        f"{pkg}/_broker.py": "from .sharding import Router\nfrom . import metrics",
        f"{pkg}/_producer.py": "from .sharding import Router\nfrom . import metrics",
        f"{pkg}/metrics.py": "",
        f"{pkg}/cli/__init__.py": "def serve():\n    from ..dashboard import app",
        f"{pkg}/dashboard/__init__.py": "from ..cli import out",
        f"{pkg}/sharding/__init__.py": "",
    }
    # The composition root may build sharded parts and adopt the metrics; no other module may
    assert direction_breaks(src, "core -/-> sharding") == [f"{PACKAGE}._producer -> {SHARDING}"]
    assert direction_breaks(src, "admin -/-> delivery path") is None
    assert direction_breaks(src, "only the CLI reaches metrics/cli/dashboard") == [
        f"{PACKAGE}._producer -> {PACKAGE}.metrics",
        f"{PACKAGE}.dashboard -> {CLI}",
    ]
    src |= {f"{pkg}/admin/_stats.py": "from ..flow._consumer import X", f"{pkg}/flow/_consumer.py": ""}
    assert direction_breaks(src, "admin -/-> delivery path") == [f"{ADMIN}._stats -> {PACKAGE}.flow._consumer"]


# -- the table of the closing note -----------------------------------------------------------
def measure(root: Path) -> dict[str, tuple[str, list[str]]]:
    """Measurement -> (its summary, its findings)."""
    src = read_sources(root)
    over = reach_over(src)
    private = private_accesses(src)
    branches = cluster_branches(src)
    files = Counter(s.split(":")[0] for s in branches)
    result = {
        "1 reach > 12 (goal: no class)": (str(len(over)), [f"{n:3} {k}" for k, n in over.items()]),
        "2 private accesses (goal <= 4)": (
            str(len(private)),
            [f"{n:3} {p}" for p, n in Counter(s.split(":")[0] for s in private).most_common()],
        ),
        "3 cluster branches (goal <= 20, in connection/)": (
            f"{len(branches)} in {len(files)} files, {len(_outside_topology(branches))} outside",
            [f"{n:3} {p}" for p, n in files.most_common()],
        ),
    }
    for top in (PACKAGE, BENCHMARKS):
        found = import_cycles(read_sources(root, top))
        result[f"4 import cycles in {top} (goal 0)"] = (str(len(found)), [" <-> ".join(c) for c in found])
    for rule in DIRECTIONS:
        breaks = direction_breaks(src, rule)
        result[f"5 {rule}"] = ("n/a" if breaks is None else str(len(breaks)), breaks or [])
    return result


def main(argv: list[str]) -> None:
    roots = [Path(a).resolve() for a in argv] or [ROOT]
    columns = [measure(root) for root in roots]
    print(f"{'measurement':50}" + "".join(f" | {str(root)[-28:]:>28}" for root in roots))
    for name in columns[0]:
        print(f"{name:50}" + "".join(f" | {column[name][0]:>28}" for column in columns))
    for root, column in zip(roots, columns, strict=True):
        print(f"\n== {root}")
        for name, (summary, findings) in column.items():
            if findings:
                print(f"{name}: {summary}\n    " + "\n    ".join(findings))


if __name__ == "__main__":
    main(sys.argv[1:])
