"""The ``workflow`` benchmark's reading of its fan-out records (no server needed)."""

from __future__ import annotations

from benchmarks.scenarios import SCENARIOS
from benchmarks.scenarios.workflow import SEQ_RUN, fan_out_runs


def _ends(run: int, times: list[float]) -> list[tuple[int, float, int]]:
    return [(run * SEQ_RUN + i, t, 1) for i, t in enumerate(times)]


def test_workflow_scenario_is_registered_and_in_all() -> None:
    from benchmarks.scenarios import NOT_IN_ALL

    assert "workflow" in SCENARIOS and "workflow" not in NOT_IN_ALL


def test_fan_out_latency_is_completion_start_minus_the_last_members_end() -> None:
    # Given one run of three members that ended at 10, 30 and 20 ms, sent at 0 ms
    ends = _ends(0, [10.0, 30.0, 20.0])
    # When its completion started once, at 32.5 ms
    result = fan_out_runs(3, [0.0], ends, [(0, 32.5, 1)])
    # Then the latency is counted from the latest end, the total from the send
    (run,) = result["runs"]
    assert (run["ok"], run["latency_ms"], run["total_ms"]) == (True, 2.5, 32.5)
    assert result["failed_runs"] == 0 and result["latency_ms"]["p99"] == 2.5


def test_fan_out_run_fails_unless_its_completion_started_exactly_once() -> None:
    # Given three runs of two members each: completions 0, 1 and 2 times
    ends = _ends(0, [1.0, 2.0]) + _ends(1, [11.0, 12.0]) + _ends(2, [21.0, 22.0])
    starts = [(1, 13.0, 1), (2, 23.0, 1), (2, 24.0, 2)]
    # When the runs are read
    result = fan_out_runs(2, [0.0, 10.0, 20.0], ends, starts)
    # Then the runs with no completion and with two fail; the latency is taken over the
    # runs whose completion started (the second's first start)
    assert [r["ok"] for r in result["runs"]] == [False, True, False]
    assert result["failed_runs"] == 2
    assert result["completions_per_run"] == [0, 1, 2]
    assert "started 2 times" in result["runs"][2]["why"]
    assert result["latency_ms"]["n"] == 2 and result["latency_ms"]["max"] == 1.0


def test_fan_out_run_fails_on_a_missing_or_repeated_member_or_an_early_completion() -> None:
    # Given run 0 whose member 1 never ran, run 1 whose member 0 ran twice, and run 2
    # whose completion started before its last member ended
    ends = [(0, 1.0, 1)] + _ends(1, [11.0, 12.0]) + [(SEQ_RUN, 11.5, 2)] + _ends(2, [21.0, 25.0])
    starts = [(0, 3.0, 1), (1, 13.0, 1), (2, 24.0, 1)]
    # When the runs are read
    result = fan_out_runs(2, [0.0, 10.0, 20.0], ends, starts)
    # Then each of them fails, saying why
    whys = [r["why"] for r in result["runs"]]
    assert [r["ok"] for r in result["runs"]] == [False, False, False]
    assert "1 of 2 members did not run" in whys[0]
    assert "1 repeated member runs" in whys[1]
    assert "before the last member's end" in whys[2]
