"""The cluster benchmark's failover analysis (``benchmarks/scenarios/cluster.py``): a
message run again after a failover counts as explained only when its first run began in
the window the promoted replica may have missed (``FAILOVER_LOSS_MS`` before the kill, up
to that long after the promotion); any other second run fails the benchmark."""

from __future__ import annotations

from typing import Any

from benchmarks.scenarios.cluster import FAILOVER_LOSS_MS, _failover_analysis

KILL_MS = 1_000_000.0
PROMOTED_MS = KILL_MS + 2_500


class _Ctx:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def log(self, line: str) -> None:
        self.lines.append(line)


def _send(seq: int, due: float) -> tuple[Any, ...]:
    # (seq, began ms, ended ms, delay, outcome, due, error class), as _produce logs them
    return (seq, due - 1000, due - 999, 1000, "ok", due, "")


def _analyse(runs: dict[int, list[float]]) -> tuple[dict[str, Any], list[str]]:
    sends = [_send(seq, min(starts)) for seq, starts in runs.items()]
    records = [(seq, start, 1) for seq, starts in runs.items() for start in starts]
    ctx = _Ctx()
    return _failover_analysis(ctx, sends, records, KILL_MS, PROMOTED_MS), ctx.lines  # type: ignore[arg-type]


def test_a_run_just_before_the_kill_run_again_after_the_promotion_is_explained() -> None:
    res, lines = _analyse({1: [KILL_MS - 300, PROMOTED_MS + 400], 2: [KILL_MS - 5000]})
    assert (res["duplicated"], res["dup_explained"], res["lost"]) == (0, 1, 0)
    assert any("message 1 ran 2 times" in line and "explained" in line for line in lines), lines


def test_a_run_long_before_the_kill_or_after_the_promotion_run_again_is_not() -> None:
    before = KILL_MS - FAILOVER_LOSS_MS - 1
    after = PROMOTED_MS + FAILOVER_LOSS_MS + 1
    res, lines = _analyse({1: [before, PROMOTED_MS + 400], 2: [after, after + 10], 3: [KILL_MS - 10]})
    assert (res["duplicated"], res["dup_explained"]) == (2, 0)
    assert sum("UNEXPLAINED" in line for line in lines) == 2, lines
