"""``python -m tests.peer [--timeout SECONDS] [PYTEST_ARGS...]``: run Dramatiq's own tests
against RedissonBroker.

Steps: find the installed Dramatiq version, fetch its sdist from PyPI into ``.peer/sdist/``
(kept for later runs), extract the sdist's ``tests/`` folder afresh into
``.peer/dramatiq-<version>/``, lay this package's support files over it and run pytest
there in a child process. The exit code is pytest's; "no tests collected" (5) is a
failure like any other non-zero code.

Arguments that name test files or node ids (``tests/test_redis.py::test_x``) replace the
default selection; every other argument goes to pytest unchanged.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

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
    "peer.ini": "pytest.ini",
}

#: Default per-test timeout in seconds (pytest-timeout).
DEFAULT_TIMEOUT = 60

#: pytest's exit code for "no tests were collected".
NO_TESTS_COLLECTED = 5

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parent.parent
CACHE_DIR = REPO_ROOT / ".peer"


def dramatiq_version() -> str:
    """The version of the Dramatiq distribution installed alongside this project."""
    return importlib.metadata.version("dramatiq")


def fetch_sdist(version: str, download_dir: Path) -> Path:
    """Return the cached sdist of ``dramatiq==version``, downloading it with pip if absent."""
    found = _cached_sdist(version, download_dir)
    if found is not None:
        return found
    download_dir.mkdir(parents=True, exist_ok=True)
    print(f"peer: downloading the dramatiq {version} sdist into {download_dir}", flush=True)
    subprocess.run(
        [
            sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
            "--no-binary", ":all:", f"dramatiq=={version}", "-d", str(download_dir),
        ],
        check=True,
    )
    found = _cached_sdist(version, download_dir)
    if found is None:
        raise SystemExit(f"peer: pip reported success but no dramatiq-{version}.tar.gz is in {download_dir}")
    return found


def _cached_sdist(version: str, download_dir: Path) -> Path | None:
    candidate = download_dir / f"dramatiq-{version}.tar.gz"
    return candidate if candidate.is_file() else None


def extract_tests(sdist: Path, version: str, target: Path) -> Path:
    """Extract only the sdist's ``tests/`` folder into an emptied ``target``; return ``target``.

    Dramatiq's own package and settings stay out, so the installed ``dramatiq`` is the
    one under test and Dramatiq's pytest options (coverage) do not apply.
    """
    prefix = f"dramatiq-{version}/tests/"
    if target.exists():
        shutil.rmtree(target)
    target.mkdir(parents=True)
    with tarfile.open(sdist, "r:gz") as archive:
        members = []
        for member in archive.getmembers():
            if not member.name.startswith(prefix) or not (member.isfile() or member.isdir()):
                continue
            member.name = member.name[len(f"dramatiq-{version}/") :]
            members.append(member)
        if not any(m.name.endswith(".py") for m in members):
            raise SystemExit(f"peer: {sdist} has no {prefix} folder")
        if hasattr(tarfile, "data_filter"):
            archive.extractall(target, members=members, filter="data")
        else:  # pragma: no cover - Python without extraction filters
            archive.extractall(target, members=members)
    return target


def install_overlay(suite: Path) -> None:
    """Copy this package's support files into the extracted suite, and make its
    ``tests/`` a package (the tests import ``from .common``)."""
    for source, destination in OVERLAY.items():
        shutil.copyfile(HERE / source, suite / destination)
    (suite / "tests" / "__init__.py").write_text('"""Dramatiq\'s test suite, as run by tests.peer."""\n')


def _parse(argv: list[str]) -> tuple[int, list[str]]:
    parser = argparse.ArgumentParser(
        prog="python -m tests.peer",
        description="Run Dramatiq's own test suite against RedissonBroker. Unknown arguments go to pytest.",
    )
    parser.add_argument(
        "--timeout", type=int, default=DEFAULT_TIMEOUT, help="per-test timeout in seconds (default %(default)s)"
    )
    options, pytest_args = parser.parse_known_args(argv)
    return options.timeout, pytest_args


def _names_tests(arg: str) -> bool:
    return arg.startswith("tests/") or (arg.startswith("test_") and ".py" in arg)


def main(argv: list[str] | None = None) -> int:
    """Prepare the suite and run pytest on it; return pytest's exit code."""
    timeout, pytest_args = _parse(sys.argv[1:] if argv is None else argv)
    version = dramatiq_version()
    sdist = fetch_sdist(version, CACHE_DIR / "sdist")
    suite = extract_tests(sdist, version, CACHE_DIR / f"dramatiq-{version}")
    install_overlay(suite)

    selection = [] if any(_names_tests(a) for a in pytest_args) else list(TEST_FILES)
    pytest_args = [f"tests/{a}" if a.startswith("test_") else a for a in pytest_args]
    command = [
        sys.executable, "-m", "pytest", "-p", "no:cacheprovider", f"--timeout={timeout}", "-rfE",
        *selection, *pytest_args,
    ]
    print(f"peer: dramatiq {version} suite in {suite}", flush=True)
    print(f"peer: {' '.join(command[1:])}", flush=True)
    code = subprocess.call(command, cwd=suite)
    if code == NO_TESTS_COLLECTED:
        print("peer: pytest collected no tests; that is a failure", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
