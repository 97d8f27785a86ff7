"""The A/B command's verdicts and the harness's parameter overrides (no server needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.ab import export_ref, verdict
from benchmarks.cli import sized


def test_a_verdict_needs_both_a_margin_and_the_rounds() -> None:
    # Lower is better: a 30 % lower p99 in 5 of 6 rounds is better.
    assert verdict("p99", [5, 5, 5, 5, 5, 9], [7, 7, 7, 7, 7, 7]) == "better"
    # The same medians, but the tree loses every round by a hair: within the margin.
    assert verdict("p99", [7.1] * 6, [7.0] * 6) == "same"
    # A median 30 % worse, but the tree wins half the rounds: noise, not a verdict.
    assert verdict("p99", [9, 9, 9, 5, 5, 5], [7, 7, 7, 7, 7, 7]) == "same"
    # Worse beyond the margin in 4 of 6 rounds.
    assert verdict("p99", [10, 10, 10, 10, 6, 6], [7, 7, 7, 7, 7, 7]) == "worse"
    # Higher is better for a rate ratio.
    assert verdict("offer vs builtin", [1.2] * 6, [1.0] * 6) == "better"
    assert verdict("offer vs builtin", [0.8] * 6, [1.0] * 6) == "worse"
    # Missing figures give no verdict.
    assert verdict("p99", [None, None], [1.0, 2.0]) == "-"


def test_set_overrides_one_parameter_of_a_size_and_nothing_else() -> None:
    params = sized("small", ["lateness.rate=500", "lateness.n=5000", "backlog.levels=[0,100000]"])
    assert params["lateness"]["rate"] == 500
    assert params["lateness"]["n"] == 5000
    assert params["backlog"]["levels"] == [0, 100000]
    # The size's own table is untouched.
    assert sized("small", [])["lateness"].get("rate") is None
    with pytest.raises(SystemExit):
        sized("small", ["lateness.rate"])
    with pytest.raises(SystemExit):
        sized("small", ["nosuch.param=1"])


def test_a_ref_is_exported_as_a_package_tree(tmp_path: Path) -> None:
    commit = export_ref("HEAD", tmp_path)
    assert commit
    assert (tmp_path / "dramatiq_redisson" / "__init__.py").is_file()
    assert (tmp_path / "dramatiq_redisson" / "lua" / "transfer.lua").is_file()


def test_jobs_run_scenarios_apart_and_report_what_failed() -> None:
    """``all --jobs N``: each scenario in a process of its own, on its own embedded server,
    the results merged back in order; a scenario that crashed is a failure of the run."""
    from benchmarks.cli import _parser, _run_apart
    from benchmarks.scenarios import SCENARIOS

    parser = _parser(list(SCENARIOS))
    args = parser.parse_args(["all", "--size", "tiny", "--brokers", "redisson", "--jobs", "2"])
    results = _run_apart(["offer", "operations"], args)
    assert list(results["scenarios"]) == ["offer", "operations"]
    assert all(s["rows"] and not s["failures"] for s in results["scenarios"].values()), results["scenarios"]
    assert results["meta"]["size"] == "tiny" and results["meta"]["jobs"] == 2

    # A scenario whose process ends without results (here: a name it refuses) fails the
    # run, and the other one still reports.
    results = _run_apart(["offer", "no-such-scenario"], args)
    assert results["scenarios"]["no-such-scenario"]["failures"] == [
        "no-such-scenario: its process exited with 2 (log above)"
    ]
    assert results["scenarios"]["offer"]["rows"] and not results["scenarios"]["offer"]["failures"]
