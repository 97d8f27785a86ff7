"""The failover harness's windows (``tests/harness/failover.py``, ``fault_events``): on a loaded
machine the sentinels may fail over a second time, promoting the restarted old primary
while the first promoted one, still alive, goes on taking writes as a primary until they
turn it into a replica about ten seconds later. Acks it took meanwhile are discarded, so a
message run then runs again: explained by that switch. A second run without such a
switch, or of a run outside its window, stays unexplained."""

from __future__ import annotations

from tests.harness.failover import Fault, fault_events
from tests.harness.faults.analysis import analyse
from tests.harness.faults.fault_common import FINISH, SENT, START, Record

KILL = 1_000_000
PROMOTED = KILL + 2_200
SECOND_SWITCH = KILL + 4_400
DEMOTED_REPLICA = KILL + 14_400


def _records(first_run: int, second_run: int) -> list[Record]:
    sent = first_run - 1500
    return [
        Record(SENT, 1, 0, 1, "1000,0", sent),
        Record(START, 1, 0, 1, "a", first_run),
        Record(FINISH, 1, 0, 1, "a", first_run + 1),
        Record(START, 1, 0, 1, "b", second_run),
        Record(FINISH, 1, 0, 1, "b", second_run + 1),
    ]


def _fault(*, second_switch: bool) -> Fault:
    report = Fault(at_ms=KILL, recovered_ms=PROMOTED, loss_ms=1000, done_ms=KILL + 3_300, switch_window_ms=2000)
    report.switches_ms = [PROMOTED - 5] + ([SECOND_SWITCH] if second_switch else [])
    report.demoted_ms = [DEMOTED_REPLICA] if second_switch else []
    return report


def _dups(first_run: int, second_run: int, *, second_switch: bool) -> tuple[int, int]:
    records = _records(first_run, second_run)
    stats = analyse(records, fault_events("sentinel-kill9", _fault(second_switch=second_switch), records))
    return stats.dup_explained, stats.dup_unexplained


def test_a_run_acked_on_the_demoted_primary_explains_its_second_run() -> None:
    assert _dups(KILL + 6_200, KILL + 15_100, second_switch=True) == (1, 0)


def test_the_same_runs_without_a_second_switch_are_unexplained() -> None:
    assert _dups(KILL + 6_200, KILL + 15_100, second_switch=False) == (0, 1)


def test_a_run_long_after_the_demoted_primary_became_a_replica_is_unexplained() -> None:
    assert _dups(KILL + 18_000, KILL + 19_000, second_switch=True) == (0, 1)


def test_the_first_switch_is_the_injected_failover_not_a_later_one() -> None:
    # Only the injected window: a run 3 s after the promotion is outside it.
    records = _records(PROMOTED + 3_000, PROMOTED + 4_000)
    events = fault_events("sentinel-kill9", _fault(second_switch=False), records)
    assert [e.kind for e in events] == ["sentinel-kill9"]
