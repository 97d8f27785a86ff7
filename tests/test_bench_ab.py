"""The A/B command's verdicts and the harness's parameter overrides (no server needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks._measure import analyze
from benchmarks.ab import READERS, export_ref, verdict
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


def test_a_work_run_gives_lateness_the_busiest_share_and_the_throughput() -> None:
    """What ab reads from a ``work-*`` scenario's JSON (RedissonBroker's figures), and
    which way each new figure is better."""
    data = {
        "params": {"kind": "sleep", "work_ms": 50},
        "redisson": {
            "lateness_ms": {"p50": 4.2, "p90": 9.0, "p99": 21.5, "max": 30.1},
            "busiest_share_pct": 57.3,
            "throughput": 74.1,
            "server_cpu_us_per_msg": 610.0,
            "commands_per_msg": 24.3,
        },
        "builtin": {"lateness_ms": {"p50": 100.0, "p99": 700.0, "max": 900.0}, "busiest_share_pct": 50.0},
        "limit": {"wait_ms": {"p50": 0, "p99": 10, "max": 27}},
    }
    for scenario in ("work-io", "work-cpu", "work-io-immediate", "work-io-90", "work-cpu-90"):
        assert READERS[scenario](data) == {
            "p50": 4.2,
            "p99": 21.5,
            "max": 30.1,
            "busiest share %": 57.3,
            "throughput/s": 74.1,
            "cpu us/msg": 610.0,
            "commands/msg": 24.3,
        }
    # Lower is better for the share, higher for the throughput.
    assert verdict("busiest share %", [55.0] * 3, [92.0] * 3) == "better"
    assert verdict("throughput/s", [60.0] * 3, [74.0] * 3) == "worse"
    assert verdict("throughput/s", [74.5] * 3, [74.0] * 3) == "same"
    # The existing scenarios read as before.
    assert READERS["lateness"]({"redisson": {"lateness_ms": {"p50": 1.0}, "offer_rate": 500}})["offer/s"] == 500


def test_a_burst_that_stalls_shows_as_the_longest_gap_between_starts() -> None:
    """``analyze`` reports the longest time between two consecutive starts (a fleet idle
    while messages wait), and ab reads it per backlog as ``gap``, a max-like figure."""
    dues = {i: 1000.0 for i in range(6)}
    # Three start at once, then nothing for 900 ms, then the rest (and a duplicate run).
    records = [(0, 1001.0, 1), (1, 1002.0, 2), (2, 1003.0, 1), (3, 1903.0, 2), (4, 1904.0, 1), (5, 1905.0, 2)]
    res = analyze(dues, [*records, (5, 1950.0, 1)])
    assert res["longest_gap_ms"] == 900.0
    assert res["duplicated"] == 1
    assert analyze({0: 1000.0}, [(0, 1001.0, 1)])["longest_gap_ms"] == 0.0
    data = {"redisson": [{"backlog": 0, "lateness_ms": {"p99": 905.0, "max": 905.0}, "longest_gap_ms": 900.0}]}
    assert READERS["backlog"](data) == {"p99 @0": 905.0, "max @0": 905.0, "gap @0": 900.0}
    # Its margin is max's (35 %): 30 % lower in every round is not yet "better".
    assert verdict("gap @0", [630.0] * 3, [900.0] * 3) == "same"
    assert verdict("gap @0", [90.0] * 3, [900.0] * 3) == "better"


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
    # A work-* scenario's parameters are keyed with "_" (work-io -> work_io).
    params = sized("full", ["work_io.procs=4", "work_io.threads=2"])
    assert (params["work_io"]["procs"], params["work_io"]["threads"]) == (4, 2)
    assert sized("full", [])["work_io"]["procs"] == 2


def test_a_ref_is_exported_as_a_package_tree(tmp_path: Path) -> None:
    commit = export_ref("HEAD", tmp_path)
    assert commit
    assert (tmp_path / "dramatiq_redisson" / "__init__.py").is_file()
    assert (tmp_path / "dramatiq_redisson" / "scripts" / "lua" / "transfer.lua").is_file()


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
