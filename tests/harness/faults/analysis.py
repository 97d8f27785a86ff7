"""Turns the records of one scenario into counts: lost, duplicated (explained or not),
early, and lateness.

Definitions (all times on the record server's clock, epoch ms):

* **due** of a message's first attempt: the ``sent`` stamp (read just *before* the send)
  + its delay. The broker computes the real due time from its own server's clock during
  the send, so the real due time is never earlier than this one.
* **due** of a retry (attempt n ≥ 1): the earliest ``fail`` stamp of attempt n-1 + 1 s
  (the actor raises ``Retry(delay=1000)`` right after stamping ``fail``).
* **early**: a run (any attempt) that started more than :data:`EARLY_TOLERANCE_MS` before
  its due time. The tolerance covers two ms-truncated reads of one host clock.
* **lateness** of a message: start of its first successful run - due of that run's
  attempt. A retried message is thus measured from its failure + 1 s, not from its
  original due time. *Ready* lateness (messages sent without delay, first attempt) is
  reported separately from *scheduled* lateness (delayed messages and retries).
* **lost**: accepted (its send did not raise) and never finished by the end of the wait.
  A send that raised is *refused*, not lost; a refused message that ran anyway is
  counted as ``refused_ran``.
* **duplicated**: finished more than once. It is *explained* when at least as many of its
  other runs (all but the last successful one) were disrupted by an injected fault as it
  has extra successes; a run is disrupted by an :class:`~.scenarios.Event` when the run,
  from its start to its end + :data:`ACK_SLACK_MS` (or forever, if it never ended), overlaps
  ``[event.start - event.loss_ms, event.end]`` and, for a process kill, ran in that
  process. Everything else is unexplained.
* **late after the fault cleared** (:func:`after_clear`): start of a message's first
  successful run - the later of its reference time (its due time; for a message a killed
  process was running, the kill) and the end of every fault window (a server stop,
  sleep, restart, full memory) that began before that run and ended after the reference.
  A send made during a stall (a stop, a sleep) is held in its socket until the stall
  ends, when the server runs the offer: its delay counts from there.
* **resume**: for each event that ends with the server accepting connections again (a
  restart, a SIGCONT): the first run started after it - its end.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from .fault_common import FAIL, FINISH, PRODUCER_DONE, READY, REFUSED, SENT, START, Record
from .scenarios import Event

EARLY_TOLERANCE_MS = 2
#: After a run ends its ack still has to reach the server.
ACK_SLACK_MS = 1000
RETRY_DELAY_MS = 1000
#: Messages later than this after their fault cleared are counted by kind in the notes.
SLOW_AFTER_CLEAR_MS = 1000


@dataclass
class Run:
    run_id: str
    seq: int
    attempt: int
    pid: int
    start_ms: int
    end: str | None = None
    end_ms: int | None = None


@dataclass
class Stats:
    """Counts of one scenario."""

    sent: int = 0
    refused: int = 0
    refused_ran: int = 0
    lost: int = 0
    lost_seqs: list[int] = field(default_factory=list)
    dup_explained: int = 0
    dup_unexplained: int = 0
    dup_unexplained_seqs: list[int] = field(default_factory=list)
    early: int = 0
    early_worst_ms: int = 0
    late_p50: float | None = None
    late_p99: float | None = None
    late_max: float | None = None
    ready_p50: float | None = None
    ready_max: float | None = None
    #: Scheduled lateness of every message (ms), for criteria on the distribution; a
    #: message whose run a process kill cut short is not in it, but in ``recovery_samples``.
    late_samples: list[int] = field(default_factory=list, repr=False)
    #: For each message a killed process was running: ms from the kill to its next run.
    recovery_samples: list[int] = field(default_factory=list, repr=False)
    #: Every message's lateness after the fault it waited through cleared (ms).
    after_clear_samples: list[int] = field(default_factory=list, repr=False)
    after_clear_p99: float | None = None
    after_clear_max: float | None = None
    #: For each server restart or SIGCONT: ms from the server accepting again to the
    #: first run started.
    resume_samples: list[int] = field(default_factory=list)
    runs: int = 0
    unfinished_runs: int = 0
    products: list[str] = field(default_factory=list)
    notes: dict[str, Any] = field(default_factory=dict)


def percentile(values: list[int], p: float) -> float | None:
    """Nearest-rank percentile; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    return float(ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)])


def disrupted(run: Run, event: Event) -> bool:
    if event.pid is not None and event.pid != run.pid:
        return False
    run_end = math.inf if run.end_ms is None else run.end_ms + ACK_SLACK_MS
    return run.start_ms <= event.end_ms and run_end >= event.start_ms - event.loss_ms


def after_clear(start_ms: int, reference_ms: int, events: list[Event]) -> int:
    """How late a run that started at ``start_ms`` was, measured from ``reference_ms``
    (its due time, or the kill of the process that held it) or from the end of each fault
    window it waited through, whichever is latest (see the module); never below 0."""
    cleared = max(
        [reference_ms]
        + [e.end_ms for e in events if e.end_ms > e.start_ms and e.start_ms <= start_ms and e.end_ms >= reference_ms]
    )
    return max(0, start_ms - cleared)


def analyse(records: list[Record], events: list[Event]) -> Stats:
    stats = Stats()
    sent: dict[int, tuple[int, int, bool]] = {}  # seq -> (sent ms, delay ms, fail once)
    refused: set[int] = set()
    refused_errors: dict[str, int] = defaultdict(int)
    runs: dict[str, Run] = {}
    products: set[str] = set()
    for r in records:
        if r.kind == SENT:
            delay, fail_once = r.extra.split(",")
            sent[r.seq] = (r.ms, int(delay), fail_once == "1")
        elif r.kind == REFUSED:
            refused.add(r.seq)
            refused_errors[r.extra] += 1
        elif r.kind == START:
            runs[r.extra] = Run(r.extra, r.seq, r.attempt, r.pid, r.ms)
        elif r.kind in (FAIL, FINISH):
            run = runs.get(r.extra)
            if run is not None:
                run.end, run.end_ms = r.kind, r.ms
        elif r.kind == READY:
            products.add(r.extra)
        elif r.kind == PRODUCER_DONE:
            pass
    stats.products = sorted(products)
    stats.sent = len(sent)
    stats.refused = len(refused)
    stats.runs = len(runs)
    stats.unfinished_runs = sum(1 for run in runs.values() if run.end is None)

    by_seq: dict[int, list[Run]] = defaultdict(list)
    for run in runs.values():
        by_seq[run.seq].append(run)
    for seq_runs in by_seq.values():
        seq_runs.sort(key=lambda run: run.start_ms)

    def due(run: Run) -> int | None:
        sent_ms, delay, _ = sent[run.seq]
        if run.attempt == 0:
            return sent_ms + delay
        fails = [r.end_ms for r in by_seq[run.seq] if r.attempt == run.attempt - 1 and r.end == FAIL]
        return min(f for f in fails if f is not None) + RETRY_DELAY_MS if fails else None

    scheduled_late: list[int] = []
    ready_late: list[int] = []
    # What the messages more than a second late after their fault cleared were, to tell
    # a slow redelivery path from a slow resume: kind -> count.
    slow_after_clear: dict[str, int] = defaultdict(int)

    def note_after_clear(kind: str, late_ms: int) -> None:
        stats.after_clear_samples.append(late_ms)
        if late_ms > SLOW_AFTER_CLEAR_MS:
            slow_after_clear[kind] += 1

    for seq in sorted(sent):
        seq_runs = by_seq.get(seq, [])
        successes = [run for run in seq_runs if run.end == FINISH]
        if not successes:
            if seq not in refused:
                stats.lost += 1
                stats.lost_seqs.append(seq)
            continue
        if seq in refused:
            stats.refused_ran += 1
        for run in seq_runs:
            run_due = due(run)
            if run_due is not None and run.start_ms < run_due - EARLY_TOLERANCE_MS:
                stats.early += 1
                stats.early_worst_ms = max(stats.early_worst_ms, run_due - run.start_ms)
        first = successes[0]
        first_due = due(first)
        cut = [
            e.start_ms
            for run in seq_runs
            if run.end is None and run.start_ms < first.start_ms
            for e in events
            if e.pid is not None and disrupted(run, e)
        ]
        if cut:
            # Held by a killed process: how soon after the kill it ran again. The next run
            # counts whatever its outcome: a fail-once message that fails there is retried
            # Retry(delay=1000) later by design, and that retry is measured from its own due.
            kill_ms = max(cut)
            again = next((run for run in seq_runs if run.start_ms >= kill_ms), first)
            stats.recovery_samples.append(again.start_ms - kill_ms)
            note_after_clear("held by a killed process", after_clear(again.start_ms, kill_ms, events))
            if first is not again and first_due is not None:
                note_after_clear("retry", after_clear(first.start_ms, first_due, events))
        elif first_due is not None:
            lateness = first.start_ms - first_due
            if first.attempt > 0:
                kind = "retry"
            elif sent[seq][1] == 0:
                kind = "immediate"
            else:
                kind = "delayed"
            if any(run.end is None for run in seq_runs if run.start_ms < first.start_ms):
                kind += " after a run that never ended"
            clear_due = first_due
            if first.attempt == 0:
                # A send made while the server stalled (a stop, a sleep) waits in its socket;
                # the server runs the offer, and starts the delay, when the stall ends.
                sent_ms, delay, _ = sent[seq]
                held = [e.end_ms for e in events if e.end_ms > e.start_ms and e.start_ms <= sent_ms <= e.end_ms]
                clear_due = max([sent_ms, *held]) + delay
            note_after_clear(kind, after_clear(first.start_ms, clear_due, events))
            if first.attempt == 0 and sent[seq][1] == 0:
                ready_late.append(lateness)
            else:
                scheduled_late.append(lateness)
        extra = len(successes) - 1
        if extra:
            others = [run for run in seq_runs if run is not successes[-1]]
            hit = sum(1 for run in others if any(disrupted(run, e) for e in events))
            if hit >= extra:
                stats.dup_explained += 1
            else:
                stats.dup_unexplained += 1
                stats.dup_unexplained_seqs.append(seq)

    stats.late_samples = scheduled_late
    stats.late_p50 = percentile(scheduled_late, 50)
    stats.late_p99 = percentile(scheduled_late, 99)
    stats.late_max = percentile(scheduled_late, 100)
    stats.ready_p50 = percentile(ready_late, 50)
    stats.ready_max = percentile(ready_late, 100)
    stats.after_clear_p99 = percentile(stats.after_clear_samples, 99)
    stats.after_clear_max = percentile(stats.after_clear_samples, 100)
    starts = sorted(run.start_ms for run in runs.values())
    for e in events:
        if e.resumed:
            later = [t for t in starts if t >= e.end_ms]
            if later:
                stats.resume_samples.append(later[0] - e.end_ms)

    if slow_after_clear:
        stats.notes[f"> {SLOW_AFTER_CLEAR_MS} ms after the fault cleared"] = ", ".join(
            f"{kind} {n}" for kind, n in sorted(slow_after_clear.items())
        )
    if refused_errors:
        stats.notes["refused by"] = ", ".join(f"{name} {n}" for name, n in sorted(refused_errors.items()))
    windows = [e for e in events if e.end_ms - e.start_ms >= 1000]
    if windows:
        stats.notes["runs started in fault windows"] = sum(
            1 for run in runs.values() if any(e.start_ms <= run.start_ms <= e.end_ms for e in windows)
        )
        stats.notes["fault window s"] = round(sum(e.end_ms - e.start_ms for e in windows) / 1000, 1)
    if stats.lost:
        # Lost after a failing attempt: the retry was never scheduled or never ran.
        stats.notes["lost after a failed attempt"] = sum(
            1 for seq in stats.lost_seqs if any(run.end == FAIL for run in by_seq.get(seq, []))
        )
        stats.notes["lost never started"] = sum(1 for seq in stats.lost_seqs if not by_seq.get(seq))
    lossy = [e for e in events if e.loss_ms]
    if lossy and stats.lost:
        # A crash can only have erased what was written in its loss window: the message's
        # last known write (its send, or the end of its last run) must fall in one.
        def last_write(seq: int) -> int:
            return max([sent[seq][0], *(run.end_ms or run.start_ms for run in by_seq.get(seq, []))])

        stats.notes["lost whose last write fell in an AOF loss window"] = sum(
            1 for seq in stats.lost_seqs if any(e.start_ms - e.loss_ms <= last_write(seq) <= e.end_ms for e in lossy)
        )
    return stats
