"""Every fault scenario at the small size (about 3-4 minutes in all on 2 cores).

Each test fails when its scenario misses its criteria (``scenarios.Criteria``: no lost
message except where a crash's AOF loss is documented, no unexplained duplicate, nothing
early). Uses its own two servers (a faulted one it kills, a record server it never
touches), whatever ``REDIS_URL`` says. ``FAULTS_PRODUCT`` points the workers at another
tree's ``dramatiq_redisson`` (default: this repository).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from .procs import DEFAULT_PRODUCT_ROOT, ValkeyProcess
from .runner import SCENARIOS, SIZES, markdown, record_server, run_scenario

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def records() -> Iterator[ValkeyProcess]:
    with record_server() as server:
        yield server


@pytest.mark.timeout(150)
@pytest.mark.parametrize("name", list(SCENARIOS))
def test_fault_scenario(name: str, records: ValkeyProcess) -> None:
    product = Path(os.environ.get("FAULTS_PRODUCT", str(DEFAULT_PRODUCT_ROOT)))
    result = run_scenario(SCENARIOS[name], SIZES["small"], records, product)
    print("\n" + markdown([result]))
    assert result.stats.sent == SIZES["small"].messages
    if result.passed:
        shutil.rmtree(result.workdir, ignore_errors=True)
    assert result.passed, f"{name}: {'; '.join(result.failures)}\n{markdown([result])}\nlogs: {result.workdir}"
