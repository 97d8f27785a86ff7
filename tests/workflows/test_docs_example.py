"""docs/workflows.md's example runs as the page says, under each failure policy."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from dramatiq_redisson import RedissonBroker

DOC = Path(__file__).parents[2] / "docs" / "workflows.md"


def _example() -> str:
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)
    [block] = [b for b in blocks if b.startswith("# docs/workflows.md example")]
    return block


@pytest.mark.usefixtures("worker")
def test_the_example_fails_under_fail_and_notifies_under_continue(broker: RedissonBroker) -> None:
    scope: dict[str, Any] = {}
    exec(compile(_example(), str(DOC), "exec"), scope)  # the actors join the test's broker
    url = "https://example.org/cat.png"

    failed = scope["resize_batch"](url, on_failure="fail").wait(timeout=20)
    assert failed.state == "failed"
    assert [(s.path, s.actor, s.state) for s in failed.steps] == [
        ("0", "fetch", "done"),
        ("1.0", "resize", "done"),
        ("1.1", "resize", "done"),
        ("1.2", "resize", "failed"),
        ("2", "notify", "skipped"),
    ]

    done = scope["resize_batch"](url, on_failure="continue").wait(timeout=20)
    assert done.state == "done"
    assert done.steps[-1].state == "done"
    assert done.result == "2 of 3 thumbnails ready"
    assert broker.dead_letters("default").size() == 2  # the failed member of each run
