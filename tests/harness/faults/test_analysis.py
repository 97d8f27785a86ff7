"""The fault suite's arithmetic on hand-written records (fast; no server): a suite that
misclassifies would report a broker as sound."""

from __future__ import annotations

from .analysis import analyse
from .fault_common import FAIL, FINISH, REFUSED, SENT, START, Record
from .scenarios import Event

T = 1_700_000_000_000


def sent(seq: int, at: int, delay: int = 0, fail_once: bool = False) -> Record:
    return Record(SENT, seq, 0, 1, f"{delay},{int(fail_once)}", T + at)


def run(seq: int, attempt: int, start: int, end: int | None, pid: int = 7, kind: str = FINISH) -> list[Record]:
    run_id = f"{pid}.{seq}.{attempt}.{start}"
    records = [Record(START, seq, attempt, pid, run_id, T + start)]
    if end is not None:
        records.append(Record(kind, seq, attempt, pid, run_id, T + end))
    return records


def test_on_time_message_counts_nothing_and_measures_lateness() -> None:
    stats = analyse([sent(0, 0, delay=1000), *run(0, 0, 1005, 1015)], [])
    assert (stats.lost, stats.dup_explained, stats.dup_unexplained, stats.early) == (0, 0, 0, 0)
    assert stats.late_max == 5


def test_lost_refused_and_refused_but_ran() -> None:
    records = [
        sent(0, 0),  # never ran: lost
        sent(1, 0),  # refused, never ran: not lost
        Record(REFUSED, 1, 0, 1, "OutOfMemoryError", T + 1),
        sent(2, 0),  # refused but ran anyway
        Record(REFUSED, 2, 0, 1, "ConnectionError", T + 1),
        *run(2, 0, 10, 20),
    ]
    stats = analyse(records, [])
    assert (stats.lost, stats.lost_seqs, stats.refused, stats.refused_ran) == (1, [0], 2, 1)


def test_early_run_of_a_delayed_message_and_of_a_retry() -> None:
    records = [
        sent(0, 0, delay=1000),
        *run(0, 0, 990, 1000),  # 10 ms early
        sent(1, 0, delay=0, fail_once=True),
        *run(1, 0, 5, 15, kind=FAIL),
        *run(1, 1, 500, 510),  # retry due at 15 + 1000
    ]
    stats = analyse(records, [])
    assert stats.early == 2
    assert stats.early_worst_ms == 515


def test_retry_lateness_is_measured_from_the_failure_plus_one_second() -> None:
    records = [sent(0, 0, fail_once=True), *run(0, 0, 3, 13, kind=FAIL), *run(0, 1, 1020, 1030)]
    stats = analyse(records, [])
    assert stats.late_max == 7 and stats.ready_max is None


def test_duplicate_explained_by_a_kill_of_the_process_running_it() -> None:
    records = [sent(0, 0), *run(0, 0, 10, 20, pid=7), *run(0, 0, 16_000, 16_010, pid=8)]
    kill = Event("kill9", T + 100, T + 100, pid=7)
    assert analyse(records, [kill]).dup_explained == 1
    other_pid = Event("kill9", T + 100, T + 100, pid=9)
    assert analyse(records, [other_pid]).dup_unexplained == 1
    long_after = Event("kill9", T + 5_000, T + 5_000, pid=7)
    assert analyse(records, [long_after]).dup_unexplained == 1


def test_duplicate_explained_by_an_aof_loss_window_only_within_it() -> None:
    records = [sent(0, 0), *run(0, 0, 10, 20), *run(0, 0, 9_000, 9_010, pid=8)]
    crash = Event("SIGKILL", T + 2_500, T + 3_500, loss_ms=2000)
    assert analyse(records, [crash]).dup_explained == 1
    clean = Event("SIGTERM", T + 2_500, T + 3_500)
    assert analyse(records, [clean]).dup_unexplained == 1


def test_lateness_after_the_fault_cleared() -> None:
    stop = Event("sigstop", T + 1_000, T + 5_000, resumed=True)
    records = [
        sent(0, 0, delay=2_000),  # due in the stop, ran 300 ms after it ended
        *run(0, 0, 5_300, 5_310),
        sent(1, 0, delay=800),  # due before the stop, ran after it: waited through it too
        *run(1, 0, 5_100, 5_110),
        sent(2, 0, delay=6_000),  # due after the stop: plain lateness
        *run(2, 0, 6_050, 6_060),
    ]
    stats = analyse(records, [stop])
    assert sorted(stats.after_clear_samples) == [50, 100, 300]
    assert stats.after_clear_max == 300
    assert stats.late_max == 4_300  # the plain figure still counts the stop
    # Delivery resumed 100 ms after the server accepted again
    assert stats.resume_samples == [100]


def test_a_kill_in_a_stop_is_measured_from_the_stops_end() -> None:
    stop = Event("sigstop", T + 1_000, T + 5_000, resumed=True)
    kill = Event("kill9", T + 2_000, T + 2_000, pid=7)
    records = [sent(0, 0), *run(0, 0, 500, None, pid=7), *run(0, 0, 7_000, 7_010, pid=8)]
    stats = analyse(records, [stop, kill])
    assert stats.recovery_samples == [5_000]  # from the kill
    assert stats.after_clear_samples == [2_000]  # from the server's return


def test_a_held_message_that_fails_on_its_next_run_is_back_at_that_run() -> None:
    # Killed while running a fail-once message; it runs again 1.9 s after the kill and
    # fails there (by design), and its retry runs on time 1 s after that failure.
    kill = Event("kill9", T + 1_000, T + 1_000, pid=7)
    records = [
        sent(0, 0, fail_once=True),
        *run(0, 0, 990, None, pid=7),
        *run(0, 0, 2_900, 2_910, pid=8, kind=FAIL),
        *run(0, 1, 3_912, 3_920, pid=8),
    ]
    stats = analyse(records, [kill])
    assert stats.recovery_samples == [1_900]  # the next run, not the retry
    assert sorted(stats.after_clear_samples) == [2, 1_900]  # the retry: 2 ms after its due


def test_a_send_held_by_a_stall_counts_its_delay_from_the_stalls_end() -> None:
    sleep = Event("debug-sleep", T + 1_000, T + 6_000)
    # Sent 2 ms into the stall with a 3 s delay: the server runs the offer at its end and
    # moves the message 3 s later; it ran 7 ms after that
    records = [sent(0, 1_002, delay=3_000), *run(0, 0, 9_007, 9_017)]
    stats = analyse(records, [sleep])
    assert stats.after_clear_samples == [7]
    assert stats.late_max == 5_005  # the plain figure counts from the send
