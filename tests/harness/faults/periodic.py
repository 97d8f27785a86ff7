"""Periodic actors under faults: the scenarios, their faults, the tick analysis and the run.

The workload is ``periodic_app``: schedules every 1 s (two) and every 2 s on the queue,
``catch_up="one"`` (the default), no producer. Every run of a tick is recorded on the
record server (schedule, tick time = ``message_timestamp``, message id, pid, when it
started and ended, the faulted server's clock at its start). The faults are timed to the
ticks (read from the stored schedule: anchor + k x every).

What is asserted, per schedule, over the *window* (from the first tick after every
schedule ran once to the last tick :data:`TAIL_MS` after the fault stopped), see
:func:`analyse_ticks`:

* **lost: none.** Every expected tick ran (a run that finished), or it is *collapsed* by
  ``catch_up="one"``: a tick the transfer moves more than the 1 s grace late (or after the
  next tick's time) is not run; the chain stops and the consumer that resumes it runs the
  latest tick due by then, once, and goes on from the next one. So a maximal gap of ticks
  that did not run, ``g1 .. gm``, is collapsed iff the tick right after it, ``n``, ran, and
  ``g1 .. gm`` and ``n`` all fell due within one *blocked interval* widened by
  :data:`PRE_MS` before (a tick due just before the fault may not have moved yet) and
  :data:`RESUME_MS` after (delivery resumes, and the resume reads its clock, within that of
  the fault's end; ``n`` is the latest tick due at the resume). A tick that started a run
  was moved, so it is never collapsed. Blocked intervals: the server down (kill to
  accepting again), the lease held by a killed process (kill to the lease's expiry, read
  from the lease key after the kill). A lost subscription blocks nothing: there a missed
  tick is lost. The server's log of moved messages (``redisson_delay_queue_sent``, read at
  the end, see :func:`read_moved`) sharpens this: no tick of a gap moved (a moved tick
  must run: a process killed with it hands it on), and ``n`` did not move (it is the
  catch-up run a resume pushed, not a tick the chain moved as usual).
* **moved within the grace.** No tick moved (and so ran) more than the grace late, or
  before its time (server clock).
* **duplicates: only after a kill -9 of the process running the tick.** A tick that ran
  more than once is counted as *redelivered after a kill* when each of its runs but the
  last was in a process killed after the run started (and before its ack: not more than
  :data:`ACK_SLACK_MS` after the run ended); any other repeat is unexplained.
* **early: none.** No run started before its tick (record clock, 2 ms tolerance for two
  truncated reads of this host's clock; and the faulted server's own clock, no tolerance).
* **off grid: none.** Each run's tick is on its schedule's grid and its message id is
  ``periodic:<name>:<tick>``.

Reported: lateness (first run's start - tick) of the ticks outside the widened blocked
intervals (p50/p99/max), the worst lateness inside them, how many ticks collapsed and into
how many catch-up runs, and how soon a tick a killed process held ran again.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import signal
import threading
import time
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import redis

from .analysis import EARLY_TOLERANCE_MS, Stats, percentile
from .fault_common import READY, Record
from .procs import DEFAULT_PRODUCT_ROOT, ValkeyProcess, WorkerFleet, subprocess_env, token_pid
from .scenarios import QUEUE, Criteria, Event, FaultContext, Scenario, Size

if TYPE_CHECKING:
    from .runner import Result

#: Record kinds written by ``periodic_app`` (it cannot import this module).
TICK = "tick"
TICK_DONE = "tick-done"

#: The schedules every periodic scenario declares (``FAULTS_PERIODIC``): name=every ms.
SCHEDULES = "tick-a=1000,tick-b=1000,tick-c=2000"

#: A tick that moves more than this late is not run by the transfer (the product's
#: ``PERIODIC_GRACE_MS``): its schedule's catch-up policy decides.
GRACE_MS = 1000
#: A tick due this long before a blocked interval began may not have moved yet.
PRE_MS = 300
#: Delivery resumes within this of a blocked interval's end (the server accepting again,
#: the killed holder's lease expiring); the collapsed run is the latest tick due by then.
RESUME_MS = 1000
#: After a run ends its ack still has to reach the server: a kill this soon after the end
#: may still redeliver the tick. The worker thread acks right after the run (a tick runs
#: 10 ms): far less than the message suite's 1 s, which would take the tick before a kill
#: 1 s after a tick for one still in flight.
ACK_SLACK_MS = 250
#: How long after a kill's time (read on the record server right before the SIGKILL) a run's
#: start record sent by the killed process may still land there (see :func:`_cut_by_kill`).
KILL_REACH_MS = 100
#: The window ends this long after the fault stopped: the schedules must be running again.
TAIL_MS = 3000
#: The broker's default dedupe window (ms): how long the server remembers moved ticks.
DEDUPE_WINDOW_MS = 120_000
#: How long the fault runs, by size.
FAULT_S = {"small": 10.0, "full": 60.0}
#: A tick a killed process held must run again within this of the kill (the lease lapses,
#: 2 s; the process is found dead by its closed connections, 2 s; see scenarios).
KILL9_MAX_RECOVERY_MS = 10_000


# -- records ---------------------------------------------------------------------------


@dataclass
class TickRun:
    """One run of a tick, from its ``tick`` and ``tick-done`` records."""

    schedule: str
    tick: int
    message_id: str
    attempt: int
    pid: int
    run_id: str
    start_ms: int
    server_ms: int | None
    end_ms: int | None = None


def tick_runs(records: Iterable[Record]) -> list[TickRun]:
    runs: dict[str, TickRun] = {}
    for r in records:
        if r.kind not in (TICK, TICK_DONE):
            continue
        schedule, message_id, server_ms, run_id = r.extra.rsplit(",", 3)
        if r.kind == TICK:
            server = int(server_ms)
            runs[run_id] = TickRun(
                schedule, r.seq, message_id, r.attempt, r.pid, run_id, r.ms, server if server >= 0 else None
            )
        elif run_id in runs:
            runs[run_id].end_ms = r.ms
    return sorted(runs.values(), key=lambda run: run.start_ms)


@dataclass(frozen=True)
class Grid:
    """A fixed-interval schedule's ticks: ``anchor + k * every_ms``, k >= 1."""

    anchor: int
    every_ms: int

    def on(self, tick: int) -> bool:
        return tick > self.anchor and (tick - self.anchor) % self.every_ms == 0

    def next_at_or_after(self, ms: int) -> int:
        k = max(1, -(-(ms - self.anchor) // self.every_ms))
        return self.anchor + k * self.every_ms

    def between(self, first_ms: int, last_ms: int) -> list[int]:
        """The ticks in ``[first_ms, last_ms]``."""
        return list(range(self.next_at_or_after(first_ms), last_ms + 1, self.every_ms))


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def read_grids(client: redis.Redis) -> dict[str, Grid]:
    """Every stored schedule's grid (``every`` schedules only), from its definition."""
    grids = {}
    for name, raw in client.hgetall(f"redisson_delay_queue_schedules:{{dramatiq:{QUEUE}}}").items():
        stored = json.loads(raw)
        every = stored["spec"].get("every_ms")
        if every:
            grids[_text(name)] = Grid(int(stored["anchor"]), int(every))
    return grids


def read_moved(client: redis.Redis) -> dict[tuple[str, int], int]:
    """The ticks the transfers moved to the ready queue, and when (server epoch ms): the
    queue's ``redisson_delay_queue_sent`` (moved members, kept for the dedupe window).
    A tick a resume ran (its catch-up) never moved: it is not there."""
    moved = {}
    entries: list[tuple[bytes, float]] = client.zrange(  # type: ignore[assignment]
        f"redisson_delay_queue_sent:{{dramatiq:{QUEUE}}}", 0, -1, withscores=True
    )
    for member, score in entries:
        text = _text(member)
        at = text.find("periodic:")
        if at >= 0:
            name, tick = text[at + len("periodic:") :].rsplit(":", 1)
            moved[(name, int(tick))] = int(score)
    return moved


# -- the analysis -----------------------------------------------------------------------


def blocked_windows(events: Iterable[Event]) -> list[tuple[int, int]]:
    """The blocked intervals (events that last) widened by :data:`PRE_MS` and
    :data:`RESUME_MS`, merged where they overlap, in order."""
    spans = sorted((e.start_ms - PRE_MS, e.end_ms + RESUME_MS) for e in events if e.end_ms > e.start_ms)
    merged: list[tuple[int, int]] = []
    for start, end in spans:
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


@dataclass
class TickStats:
    """What :func:`analyse_ticks` found (ticks are ``(schedule, tick ms)``)."""

    expected: int = 0
    ran: int = 0
    collapsed: int = 0  # ticks not run by catch_up="one" (each gap runs its next tick)
    gaps: int = 0  # gaps of collapsed ticks
    catch_up_runs: int = 0  # runs of a tick no transfer moved (pushed by a resume)
    collapsed_before_fault: int = 0  # collapsed ticks due in the PRE_MS before their fault
    lost: list[tuple[str, int]] = field(default_factory=list)
    redelivered: int = 0  # extra runs after a kill -9 of the process running the tick
    redelivered_ticks: list[tuple[str, int]] = field(default_factory=list)
    unexplained: list[tuple[str, int]] = field(default_factory=list)
    early: list[tuple[str, int, int]] = field(default_factory=list)  # (schedule, tick, ms early)
    early_server: list[tuple[str, int, int]] = field(default_factory=list)
    off_grid: list[str] = field(default_factory=list)  # message ids
    pending: list[tuple[str, int]] = field(default_factory=list)  # cut by a kill, not run again yet
    #: Moved by a transfer more than the grace late (it must then not run: the chain stops)
    #: or before its time (server clock).
    moved_late: list[tuple[str, int, int]] = field(default_factory=list)
    moved_early: list[tuple[str, int, int]] = field(default_factory=list)
    late_outside: list[int] = field(default_factory=list)
    late_inside: list[int] = field(default_factory=list)
    moved_late_outside: list[int] = field(default_factory=list)  # move - tick, server clock
    catch_up_outside: list[tuple[str, int]] = field(default_factory=list)  # resumes outside blocked intervals
    recovery: list[int] = field(default_factory=list)  # kill -> next run of a tick it was running
    runs: int = 0
    unfinished_runs: int = 0
    windows: list[tuple[int, int]] = field(default_factory=list)


def _cut_by_kill(run: TickRun, kills: list[Event]) -> Event | None:
    """The kill -9 of the process that ran ``run`` while it ran or before its ack.

    A killed process starts nothing after the SIGKILL, but the start record of a run it
    began a moment before can reach the record server after the kill's time was read
    there (a CI run saw one 1 ms after, on a loaded machine): a run that starts up to
    :data:`KILL_REACH_MS` after its process's kill is one of its runs before the kill."""
    for kill in kills:
        if kill.pid != run.pid or run.start_ms > kill.start_ms + KILL_REACH_MS:
            continue
        if run.end_ms is None or kill.start_ms - run.end_ms <= ACK_SLACK_MS:
            return kill
    return None


def analyse_ticks(
    runs: list[TickRun],
    events: list[Event],
    grids: dict[str, Grid],
    window: tuple[int, int],
    moved: dict[tuple[str, int], int] | None = None,
) -> TickStats:
    """Check the runs of the ticks of ``grids`` due in ``window`` (see the module).

    ``moved``: the ticks the transfers moved to the ready queue, and when (server clock),
    as the server remembers them (``redisson_delay_queue_sent``, kept for the dedupe
    window); ``None`` when unknown. With it, a tick that moved is never taken as collapsed
    (it must run), the run that stands for a gap must be a catch-up run (a tick that did
    not move: pushed by the resume), and no tick may move later than the grace."""
    stats = TickStats(runs=len(runs))
    kills = [e for e in events if e.pid is not None]
    windows = stats.windows = blocked_windows(events)

    def widened(ms: int) -> tuple[int, int] | None:
        return next((w for w in windows if w[0] <= ms <= w[1]), None)

    by_tick: dict[tuple[str, int], list[TickRun]] = defaultdict(list)
    for run in runs:
        grid = grids.get(run.schedule)
        if grid is None or not grid.on(run.tick) or run.message_id != f"periodic:{run.schedule}:{run.tick}":
            stats.off_grid.append(run.message_id)
            continue
        by_tick[(run.schedule, run.tick)].append(run)
        if run.start_ms < run.tick - EARLY_TOLERANCE_MS:
            stats.early.append((run.schedule, run.tick, run.tick - run.start_ms))
        if run.server_ms is not None and run.server_ms < run.tick:
            stats.early_server.append((run.schedule, run.tick, run.tick - run.server_ms))
    for (name, tick), at in sorted((moved or {}).items()):
        if at - tick > GRACE_MS:
            stats.moved_late.append((name, tick, at - tick))
        elif at < tick:
            stats.moved_early.append((name, tick, tick - at))

    for key, tick_runs_ in by_tick.items():
        if len(tick_runs_) > 1:
            cut = [_cut_by_kill(run, kills) for run in tick_runs_[:-1]]
            if all(cut):
                stats.redelivered += len(cut)
                stats.redelivered_ticks.append(key)
            else:
                stats.unexplained.append(key)
        for i, run in enumerate(tick_runs_):
            kill = _cut_by_kill(run, kills)
            if kill is not None and run.end_ms is None:
                later = tick_runs_[i + 1 :]
                if later:
                    stats.recovery.append(later[0].start_ms - kill.start_ms)
                elif not any(r.end_ms is not None for r in tick_runs_):
                    stats.pending.append(key)

    start, end = window
    for name, grid in sorted(grids.items()):
        expected = grid.between(start, end)
        stats.expected += len(expected)
        finished = {t for (s, t), rs in by_tick.items() if s == name and any(r.end_ms is not None for r in rs)}
        stats.unfinished_runs += sum(
            1 for t in expected for r in by_tick.get((name, t), []) if r.end_ms is None and not _cut_by_kill(r, kills)
        )
        gap: list[int] = []
        for t in [*expected, None]:
            if t is not None and t not in finished:
                gap.append(t)
                continue
            if gap:
                n = gap[-1] + grid.every_ms  # the run that stands for the gap, by catch_up="one"
                w = widened(gap[0])
                collapsible = (
                    n in finished
                    and w is not None
                    and n <= w[1]
                    and not any(by_tick.get((name, g)) for g in gap)  # a run started: it moved
                    and (moved is None or (not any((name, g) in moved for g in gap) and (name, n) not in moved))
                )
                if collapsible:
                    assert w is not None
                    stats.collapsed += len(gap)
                    stats.gaps += 1
                    stats.collapsed_before_fault += sum(1 for g in gap if g < w[0] + PRE_MS)
                else:
                    stats.lost += [(name, g) for g in gap]
                gap = []
        for t in expected:
            if t not in finished:
                continue
            stats.ran += 1
            first = by_tick[(name, t)][0]
            late = first.start_ms - t
            held = any(_cut_by_kill(r, kills) for r in by_tick[(name, t)])
            inside = held or widened(t) is not None
            (stats.late_inside if inside else stats.late_outside).append(late)
            if moved is not None and (name, t) not in moved:
                stats.catch_up_runs += 1
                if widened(t) is None:
                    stats.catch_up_outside.append((name, t))
            elif moved is not None and not inside:
                stats.moved_late_outside.append(moved[(name, t)] - t)
    return stats


def to_stats(ticks: TickStats, notes: dict[str, Any], products: list[str]) -> Stats:
    """The figures in the suite's table: sent = expected ticks, lost, dup expl. = runs
    again after a kill -9, dup unexpl., early (either clock), lateness outside the
    blocked intervals."""
    stats = Stats()
    stats.sent = ticks.expected
    stats.lost = len(ticks.lost)
    stats.lost_seqs = [t for _, t in ticks.lost]
    stats.dup_explained = ticks.redelivered
    stats.dup_unexplained = len(ticks.unexplained)
    stats.dup_unexplained_seqs = [t for _, t in ticks.unexplained]
    early = {(s, t): ms for s, t, ms in [*ticks.early, *ticks.early_server]}
    stats.early = len(early)
    stats.early_worst_ms = max(early.values(), default=0)
    stats.late_samples = ticks.late_outside
    stats.late_p50 = percentile(ticks.late_outside, 50)
    stats.late_p99 = percentile(ticks.late_outside, 99)
    stats.late_max = percentile(ticks.late_outside, 100)
    stats.recovery_samples = ticks.recovery
    stats.runs = ticks.runs
    stats.unfinished_runs = ticks.unfinished_runs
    stats.products = products
    stats.notes = dict(notes)
    stats.notes["ticks ran"] = ticks.ran
    stats.notes["collapsed by catch_up=one (gaps)"] = f"{ticks.collapsed} ({ticks.gaps})"
    stats.notes["catch-up runs (ticks no transfer moved)"] = ticks.catch_up_runs
    if ticks.catch_up_outside:
        stats.notes["catch-up runs outside blocked intervals"] = ", ".join(
            f"{s}@{t}" for s, t in ticks.catch_up_outside[:10]
        )
    if ticks.moved_late_outside:
        stats.notes["moved late outside blocked intervals p50/p99/max ms (server)"] = (
            f"{percentile(ticks.moved_late_outside, 50):.0f}/{percentile(ticks.moved_late_outside, 99):.0f}"
            f"/{max(ticks.moved_late_outside)}"
        )
    if ticks.collapsed_before_fault:
        stats.notes[f"collapsed ticks due < {PRE_MS} ms before their fault"] = ticks.collapsed_before_fault
    if ticks.late_inside:
        stats.notes["late in/after a blocked interval, or held by a killed process: max ms"] = max(ticks.late_inside)
    if ticks.redelivered_ticks:
        stats.notes["ticks run again after a kill -9 of the process running them"] = len(ticks.redelivered_ticks)
    if ticks.recovery:
        stats.notes["cut by a kill: run again ms after it, p50/max"] = (
            f"{percentile(ticks.recovery, 50):.0f}/{max(ticks.recovery)}"
        )
    if ticks.pending:
        stats.notes["cut by a kill and never run again"] = ", ".join(f"{s}@{t}" for s, t in ticks.pending[:10])
    if ticks.lost:
        stats.notes["lost ticks"] = ", ".join(f"{s}@{t}" for s, t in ticks.lost[:10])
    if ticks.unexplained:
        stats.notes["ticks run twice (unexplained)"] = ", ".join(f"{s}@{t}" for s, t in ticks.unexplained[:10])
    if ticks.off_grid:
        stats.notes["off-grid runs"] = ", ".join(ticks.off_grid[:10])
    if ticks.early_server:
        stats.notes["early by the faulted server's clock"] = len(ticks.early_server)
    return stats


def check_ticks(ticks: TickStats, notes: dict[str, Any], kinds: tuple[str, ...]) -> list[str]:
    """The periodic scenarios' criteria, as failure messages."""
    failures = []
    if ticks.lost:
        failures.append(f"lost {len(ticks.lost)} ticks (e.g. {ticks.lost[:5]})")
    if ticks.pending:
        failures.append(f"{len(ticks.pending)} ticks cut by a kill never ran again (e.g. {ticks.pending[:5]})")
    if ticks.unexplained:
        failures.append(f"{len(ticks.unexplained)} ticks ran twice, not after a kill (e.g. {ticks.unexplained[:5]})")
    if ticks.early or ticks.early_server:
        failures.append(f"early runs: {ticks.early[:5]} (record clock), {ticks.early_server[:5]} (server clock)")
    if ticks.moved_late or ticks.moved_early:
        failures.append(
            f"ticks moved to run past the {GRACE_MS} ms grace: {ticks.moved_late[:5]}; "
            f"before their time: {ticks.moved_early[:5]}"
        )
    if ticks.off_grid:
        failures.append(f"{len(ticks.off_grid)} runs off their schedule's grid (e.g. {ticks.off_grid[:5]})")
    slow = [ms for ms in ticks.recovery if ms > KILL9_MAX_RECOVERY_MS]
    if slow:
        failures.append(f"{len(slow)} ticks cut by a kill ran again more than {KILL9_MAX_RECOVERY_MS} ms after it")
    if ticks.ran == 0:
        failures.append("no tick ran")
    if not any(notes.get(kind) for kind in kinds):
        failures.append(f"no fault injected (none of {', '.join(kinds)})")
    if "fault error" in notes:
        failures.append(f"fault could not be injected: {notes['fault error']}")
    return failures


# -- the faults -----------------------------------------------------------------------


def _lease_key() -> str:
    return f"redisson_delay_queue_lease:{{dramatiq:{QUEUE}}}"


def _reference(admin: redis.Redis) -> Grid:
    """The grid the faults are timed to: the schedule with the shortest interval."""
    grids = read_grids(admin)
    return min(grids.values(), key=lambda g: (g.every_ms, g.anchor))


def _at(ctx: FaultContext, grid: Grid, offset_ms: int) -> bool:
    """Wait until ``offset_ms`` after a tick of ``grid`` at least 50 ms away (host clock,
    the servers' too); False once the fault must stop."""
    now = time.time() * 1000
    target = grid.next_at_or_after(int(now + 50 - offset_ms)) + offset_ms
    while True:
        left = target - time.time() * 1000
        if left <= 0:
            return not ctx.stop.is_set()
        if ctx.stop.wait(min(left, 50) / 1000):
            return False


#: Where in a tick the lease holder is killed (ms from the tick): before it moves it,
#: while the transfer runs or hands it off to itself, while it runs, after.
KILL_OFFSETS_MS = (0, 5, -20, 12, 40, -5, 2, 150)


def owner_kill9_at_ticks(ctx: FaultContext) -> None:
    """Every ~5 s (full size), SIGKILL the worker process that holds the queue's transfer
    lease, right at a tick (:data:`KILL_OFFSETS_MS`). The event lasts from the kill to the
    lease's expiry, read after the kill (the killed process's last call may still renew it
    on the server): until then no process moves a tick."""
    lease = _lease_key()
    admin = ctx.admin()
    offsets = itertools.cycle(KILL_OFFSETS_MS)
    try:
        grid = _reference(admin)
        while ctx.wait(5.0):
            offset = next(offsets)
            pids = set(ctx.fleet.worker_pids())
            if not _at(ctx, grid, offset):
                return
            holder = admin.get(lease)
            token = _text(holder).split(" ")[0] if holder else ""
            pid = token_pid(token)
            if pid is None or pid not in pids:
                ctx.count("lease holder not found")
                continue
            at = ctx.clock()
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                ctx.count("lease holder not found")
                continue
            time.sleep(0.1)
            after = admin.get(lease)
            expiry = at
            if after and _text(after).split(" ")[0] == token:
                expiry = max(at, int(_text(after).split(" ")[1]))
            ctx.event("owner-kill9", at, expiry, pid=pid)
            ctx.count("kills")
            ctx.notes.setdefault("kill offsets from a tick ms", []).append(offset)
    finally:
        admin.close()


#: Downtimes (s) of the server restarts: within the grace (ticks run late) and beyond it
#: (ticks collapse), and where in a tick the crash comes (ms after it).
RESTART_DOWN_S = (1.5, 0.4, 2.5, 0.8)
RESTART_PHASES_MS = (600, 0, 300, 900)


def server_restart_at_ticks(ctx: FaultContext) -> None:
    """Every ~6 s (full size) SIGKILL the server at a phase of a tick and start it again on
    the same port with its AOF after :data:`RESTART_DOWN_S`. The event lasts from the
    kill to the server answering PING again."""
    admin = ctx.admin()
    try:
        grid = _reference(admin)
    finally:
        admin.close()
    for down, phase in zip(itertools.cycle(RESTART_DOWN_S), itertools.cycle(RESTART_PHASES_MS), strict=False):
        if not ctx.wait(6.0) or not _at(ctx, grid, phase):
            return
        at = ctx.clock()
        ctx.server.signal(signal.SIGKILL)
        ctx.server.wait_exit()
        time.sleep(down)
        ctx.server.start()
        ctx.event("SIGKILL", at, ctx.clock(), resumed=True)
        ctx.count("restarts")


PUBSUB_PHASES_MS = (0, 5, -10, 500, 20, 250, -50, 2)


def pubsub_kill_at_ticks(ctx: FaultContext) -> None:
    """``CLIENT KILL TYPE pubsub`` about every 1.5 s at a phase of a tick: every consumer
    loses its subscription (the lease holder its announcements). Blocks nothing."""
    admin = ctx.admin()
    phases = itertools.cycle(PUBSUB_PHASES_MS)
    try:
        grid = _reference(admin)
        while ctx.wait(ctx.rng.uniform(0.5, 1.5) / ctx.size.scale):
            if not _at(ctx, grid, next(phases)):
                return
            at = ctx.clock()
            killed = admin.execute_command("CLIENT", "KILL", "TYPE", "pubsub")
            ctx.event("client-kill-pubsub", at)
            ctx.count("injections")
            ctx.count("connections killed", int(killed))
    finally:
        admin.close()


# -- the scenarios ----------------------------------------------------------------------


@dataclass(frozen=True)
class PeriodicScenario(Scenario):
    """A scenario of the periodic workload (``periodic_app``; run by :func:`run_periodic_scenario`)."""

    schedules: str = SCHEDULES
    #: The notes counting the fault's injections: at least one must be there.
    injections: tuple[str, ...] = ()


PERIODIC_SCENARIOS: dict[str, PeriodicScenario] = {
    s.name: s
    for s in [
        PeriodicScenario(
            "periodic-owner-kill9",
            owner_kill9_at_ticks,
            "periodic ticks (2 x every 1 s, every 2 s): SIGKILL the transfer lease holder right at a tick "
            "every 5 s; 3 single-process commands",
            commands=3,
            processes=1,
            builtin=False,
            criteria=Criteria(max_recovery_ms=KILL9_MAX_RECOVERY_MS),
            injections=("kills",),
        ),
        PeriodicScenario(
            "periodic-server-restart",
            server_restart_at_ticks,
            "periodic ticks: server SIGKILL at a phase of a tick every 6 s, down 0.4-2.5 s, restart with its "
            "AOF (appendfsync always); 2 single-process commands",
            server_config={"appendfsync": "always"},
            commands=2,
            processes=1,
            builtin=False,
            injections=("restarts",),
        ),
        PeriodicScenario(
            "periodic-pubsub-kill",
            pubsub_kill_at_ticks,
            "periodic ticks: CLIENT KILL TYPE pubsub about every 1.5 s at a phase of a tick; 2 single-process commands",
            commands=2,
            processes=1,
            builtin=False,
            injections=("injections",),
        ),
    ]
}


# -- the run -----------------------------------------------------------------------------


def run_periodic_scenario(
    scenario: PeriodicScenario, size: Size, records: ValkeyProcess, product_root: Path = DEFAULT_PRODUCT_ROOT
) -> Result:
    """One periodic scenario on a fresh faulted server and fresh record keys: boot the
    workers, wait until every schedule ran a tick, inject the fault for
    :data:`FAULT_S` seconds, wait until the window's ticks ran (or could not any more),
    stop the workers, analyse."""
    from .runner import Result, _scan_logs, _wait, boot_fleet, inject_for, prepare, stamped, start_faulted, stop_fleet

    began, workdir, prefix, reader, server = prepare(scenario, records)
    fleet: WorkerFleet | None = None
    stop = threading.Event()
    notes: dict[str, Any] = {}
    interrupted = False
    try:
        server = start_faulted(server, workdir)
        env = subprocess_env(
            product_root,
            {
                "FAULTS_BROKER_URL": server.url,
                "FAULTS_RECORD_URL": records.url,
                "FAULTS_PREFIX": prefix,
                "FAULTS_QUEUE": QUEUE,
                "FAULTS_PERIODIC": scenario.schedules,
                "FAULTS_BROKER": "redisson",
            },
        )
        exits: list[int] = []
        fleet = boot_fleet(
            "periodic_app:broker", scenario, size, env, workdir, reader, lambda command, code: exits.append(code)
        )
        names = [item.split("=")[0] for item in scenario.schedules.split(",")]
        admin = redis.Redis(host="127.0.0.1", port=server.port)
        grids: dict[str, Grid] = {}

        def warm() -> bool:
            nonlocal grids
            reader.poll()
            grids = read_grids(admin)
            ran = {run.schedule for run in tick_runs(reader.records) if run.end_ms is not None}
            return set(names) <= set(grids) and set(names) <= ran

        _wait(warm, 30, "a first tick of every schedule")
        admin.close()
        window_start = reader.now_ms() + 1

        ctx = FaultContext(server=server, fleet=fleet, size=size, stop=stop, clock=reader.now_ms, notes=notes)
        inject_for(scenario, ctx, FAULT_S[size.name], reader)
        window_end = reader.now_ms() + TAIL_MS
        longest = max(grid.every_ms for grid in grids.values())
        kills = [e.start_ms for e in ctx.events if e.pid is not None]
        # Wait until every tick of the window ran or was collapsed (a gap is lost until the
        # run that stands for it, a tick later, ran) and what a killed process held ran
        # again; at most until neither can come any more.
        done_at = window_end + 500
        deadline_ms = max(window_end + longest + 3000, max(kills, default=0) + KILL9_MAX_RECOVERY_MS + 2000)
        admin = redis.Redis(host="127.0.0.1", port=server.port, socket_timeout=10)
        while True:
            reader.poll()
            now = reader.now_ms()
            if now >= deadline_ms:
                break
            if now >= done_at:
                window = (window_start, window_end)
                ticks = analyse_ticks(tick_runs(reader.records), ctx.events, grids, window, read_moved(admin))
                if not ticks.lost and not ticks.pending:
                    break
            time.sleep(0.2)
        stop_fleet(fleet, exits, notes)
        reader.poll()
        try:
            if read_grids(admin) != grids:
                notes["schedule anchors changed during the run"] = True
            moved: dict[tuple[str, int], int] | None = read_moved(admin)
            if window_start < reader.now_ms() - DEDUPE_WINDOW_MS + 10_000:
                moved = None  # the oldest moves of the window may be forgotten already
                notes["move log"] = "not used (the run outlasted the dedupe window)"
        finally:
            admin.close()
        with open(workdir / "records.txt", "w") as out:
            out.writelines(f"{r.kind}|{r.seq}|{r.attempt}|{r.pid}|{r.extra}|{r.ms}\n" for r in reader.records)
            out.writelines(f"event|{e!r}\n" for e in ctx.events)
            out.write(f"window|{window_start}|{window_end}\ngrids|{grids!r}\n")
            out.writelines(f"moved|{name}|{tick}|{at}\n" for (name, tick), at in sorted((moved or {}).items()))
        runs = tick_runs(reader.records)
        ticks = analyse_ticks(runs, ctx.events, grids, (window_start, window_end), moved)
        products = sorted({r.extra for r in reader.records if r.kind == READY})
        stats = to_stats(ticks, notes, products)
        failures = check_ticks(ticks, notes, scenario.injections)
        if notes.get("schedule anchors changed during the run"):
            failures.append("a schedule's anchor changed during the run (stored again)")
        levels, samples = _scan_logs([command.log_path for command in fleet.commands])
        return stamped(Result(scenario.name, size.name, stats, failures, levels, samples), began, workdir)
    except KeyboardInterrupt:
        interrupted = True
        raise
    finally:
        stop.set()
        if fleet is not None:
            fleet.stop()
        server.stop()
        reader.close()
        if interrupted:
            shutil.rmtree(workdir, ignore_errors=True)


__all__ = [
    "PERIODIC_SCENARIOS",
    "Grid",
    "PeriodicScenario",
    "TickRun",
    "analyse_ticks",
    "run_periodic_scenario",
]
