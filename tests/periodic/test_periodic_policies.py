"""Periodic actors under load (issue 50), on a real server with real worker processes:
overlap="skip" never lets two runs of a schedule overlap and counts the ticks it skips;
jitter spreads schedules of the same ticks over its bound and each tick still runs once;
a start deadline drops the ticks that could not start in time (missed while every worker
was down, or waiting behind a busy worker); a window and a limit end a schedule; bad
values are refused at declaration, all named in one error, with nothing written."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import dramatiq
import pytest
import redis
from dramatiq import Worker
from dramatiq.middleware import CurrentMessage

from dramatiq_redisson import InvalidSchedule, RedissonBroker, ScheduleInfo, periodic
from dramatiq_redisson.periodic._schedules import PeriodicStartDeadline
from dramatiq_redisson.periodic._spec import jitter_offset
from tests.helpers import READY, record, records, server_ms, stop_worker_processes, wait_for

ROOT = Path(__file__).resolve().parents[2]


@contextmanager
def policy_workers(
    redis_url: str, client: redis.Redis, count: int, schedules: list[dict[str, Any]], logs: Path
) -> Iterator[None]:
    """``count`` processes of tests/periodic_policy_worker.py declaring ``schedules``, their
    output in ``logs``/worker-<n>.log, stopped (and checked to exit 0) at the end."""
    env = {**os.environ, "REDIS_URL": redis_url, "PYTHONPATH": str(ROOT), "SCHEDULES": json.dumps(schedules)}
    client.delete("test:stop", "test:workers-ready")
    procs, outputs = [], []
    for n in range(count):
        out = open(logs / f"worker-{n}.log", "ab")  # noqa: SIM115 (closed below)
        outputs.append(out)
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "tests.periodic_policy_worker"],
                env=env,
                cwd=ROOT,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        )
    try:
        assert wait_for(lambda: int(client.get(READY) or 0) == count, timeout=30), _logs(logs)
        yield
    finally:
        stop_worker_processes(client, procs)
        for out in outputs:
            out.close()
    assert [p.returncode for p in procs] == [0] * count, _logs(logs)


def _logs(logs: Path) -> str:
    return "\n".join(f"--- {p.name}:\n{p.read_text(errors='replace')[-3000:]}" for p in sorted(logs.glob("*.log")))


def _info(redis_url: str, name: str) -> ScheduleInfo:
    return RedissonBroker(url=redis_url).schedules.get(name)


def _ended(redis_url: str, name: str) -> str | None:
    """How schedule ``name`` has ended; None while it runs or before a worker stored it (the
    workers store their schedules once their consumers start, after they said ready)."""
    try:
        return _info(redis_url, name).ended
    except KeyError:
        return None


def _runs(client: redis.Redis, name: str) -> list[dict[str, Any]]:
    return sorted((r for r in records(client) if r.get("name") == name), key=lambda r: r["tick"])


def _aligned(client: redis.Redis, step_ms: int, ahead_ms: int) -> datetime:
    """A server time at least ``ahead_ms`` from now, on a multiple of ``step_ms``."""
    at = (server_ms(client) + ahead_ms) // step_ms * step_ms + step_ms
    return datetime.fromtimestamp(at / 1000, tz=timezone.utc)


# -- overlap="skip" -------------------------------------------------------------------


@pytest.mark.slow
def test_overlap_skip_with_runs_of_3_5_s_every_1_s_never_overlaps_and_counts_the_skipped_ticks(
    redis_url: str, redis_client: redis.Redis, tmp_path: Path
) -> None:
    # Given two worker processes (4 threads each) with a schedule every 1 s whose runs take 3.5 s
    schedule = {"every": "1s", "name": "slow-report", "overlap": "skip", "hold_s": 3.5}
    with policy_workers(redis_url, redis_client, 2, [schedule], tmp_path):
        # When it runs for 11 s
        assert wait_for(lambda: _runs(redis_client, "slow-report"), timeout=8)
        time.sleep(7)
        info = _info(redis_url, "slow-report")
    runs = _runs(redis_client, "slow-report")
    # Then no two runs overlapped
    for before, after in zip(runs, runs[1:], strict=False):
        assert after["started_ms"] >= before["ended_ms"], (before, after)
    # and the ticks that came due while a run was queued or running were skipped and counted:
    # one run per 4 ticks (3.5 s of run, then the next tick)
    assert len(runs) >= 2, runs
    assert info.overlap == "skip" and info.skipped >= 3 * (len(runs) - 1), info
    ticks = [r["tick"] for r in runs]
    assert all(b - a >= 4_000 for a, b in zip(ticks, ticks[1:], strict=False)), ticks
    print(f"\noverlap: {len(runs)} runs, {info.skipped} ticks skipped, runs at {ticks}")


# -- jitter ---------------------------------------------------------------------------


@pytest.mark.slow
def test_jitter_spreads_200_schedules_of_the_same_ticks_over_the_bound_and_each_tick_runs_once(
    redis_url: str, redis_client: redis.Redis, tmp_path: Path
) -> None:
    # Given 200 schedules with the same ticks (every 3 s from the same start) and a 2 s jitter
    start = _aligned(redis_client, 3_000, 4_000)
    names = [f"spread-{n:03d}" for n in range(200)]
    schedules = [{"every": "3s", "start": start.isoformat(), "jitter": "2s", "name": name} for name in names]
    with policy_workers(redis_url, redis_client, 2, schedules, tmp_path):
        # When two of their ticks fall
        second = int(start.timestamp() * 1000) + 3_000
        assert wait_for(
            lambda: len(records(redis_client)) >= 400, timeout=15 + (second - server_ms(redis_client)) / 1000
        )
        time.sleep(0.5)
    ran = records(redis_client)
    first = int(start.timestamp() * 1000)
    # Then each tick of each schedule ran exactly once, under its own id and time
    counts = Counter((r["name"], r["tick"]) for r in ran)
    assert set(counts) == {(name, tick) for name in names for tick in (first, second)}, sorted(counts)[:5]
    assert set(counts.values()) == {1}
    assert all(r["message_id"] == f"periodic:{r['name']}:{r['tick']}" for r in ran)
    # never before its offset, which spreads the ticks over [0, 2 s)
    offsets = [jitter_offset(r["name"], r["tick"], 2_000) for r in ran]
    late = [r["started_ms"] - r["tick"] - o for r, o in zip(ran, offsets, strict=True)]
    assert min(late) >= 0, "a tick started before its jittered due time"
    starts = sorted(r["started_ms"] - r["tick"] for r in ran)
    assert starts[0] < 200 and starts[-1] > 1_800, (starts[0], starts[-1])
    in_halves = Counter(o < 1_000 for o in offsets)
    assert min(in_halves.values()) >= 150, in_halves  # about half each side (400 ticks)
    print(
        f"\njitter: {len(ran)} ticks ran once each; offsets {min(offsets)}-{max(offsets)} ms, "
        f"started {starts[0]}-{starts[-1]} ms after their time, {max(late)} ms at most after their due time"
    )


# -- start deadline -------------------------------------------------------------------


@pytest.mark.slow
def test_a_start_deadline_drops_the_ticks_missed_while_every_worker_was_down(
    redis_url: str, redis_client: redis.Redis, tmp_path: Path
) -> None:
    schedule = {"every": "1s", "name": "fresh-only", "catch_up": "all", "start_deadline": "1500ms"}
    # Given a schedule that ran for a while on two worker processes, then every worker stopped
    with policy_workers(redis_url, redis_client, 2, [schedule], tmp_path):
        assert wait_for(lambda: len(_runs(redis_client, "fresh-only")) >= 2, timeout=8)
    last_before = _runs(redis_client, "fresh-only")[-1]["tick"]
    # When no worker runs for 5 s, then they start again
    time.sleep(5)
    with policy_workers(redis_url, redis_client, 2, [schedule], tmp_path):
        resumed_at = server_ms(redis_client)
        time.sleep(2)
        info = _info(redis_url, "fresh-only")
    missed = [t for t in range(last_before + 1_000, resumed_at, 1_000)]
    ran = {r["tick"]: r for r in _runs(redis_client, "fresh-only")}
    # Then the missed ticks older than the deadline when they were resumed were dropped and
    # counted; those still within it ran; no tick started later than its deadline
    assert info.dropped >= 3, (info, missed)
    assert len([t for t in missed if t not in ran]) == info.dropped, (missed, sorted(ran), info)
    assert all(r["started_ms"] - r["tick"] <= 1_500 + 300 for r in ran.values()), ran
    print(f"\nstart deadline: {len(missed)} ticks missed while down, {info.dropped} dropped")


@pytest.mark.slow
def test_a_tick_that_waits_past_its_start_deadline_behind_a_busy_worker_is_dropped_and_counted(
    broker: RedissonBroker, redis_client: redis.Redis
) -> None:
    broker.add_middleware(CurrentMessage())

    @dramatiq.actor(max_retries=0)
    def blocker() -> None:
        time.sleep(2.2)

    @periodic(every="1s", name="deadline-busy", start_deadline="400ms")
    @dramatiq.actor(max_retries=0)
    def punctual() -> None:
        message = CurrentMessage.get_current_message()
        assert message is not None
        record(redis_client, name="deadline-busy", tick=message.message_timestamp, started_ms=server_ms(redis_client))

    assert any(isinstance(m, PeriodicStartDeadline) for m in broker.middleware)
    # Given one worker thread, busy for 2.2 s with another message when ticks come due
    worker = Worker(broker, worker_threads=1, worker_timeout=50)
    worker.start()
    try:
        broker.schedules.wait_until_stored(["deadline-busy"])
        assert wait_for(lambda: _runs(redis_client, "deadline-busy"), timeout=5)
        blocker.send()
        time.sleep(4.5)
    finally:
        worker.stop()
    info = broker.schedules.get("deadline-busy")
    runs = _runs(redis_client, "deadline-busy")
    # Then the ticks that waited behind it were dropped, counted, and never ran late
    assert info.dropped >= 1, info
    assert all(r["started_ms"] - r["tick"] <= 400 + 200 for r in runs), runs
    assert info.start_deadline_ms == 400


# -- window and limit -----------------------------------------------------------------


@pytest.mark.slow
def test_a_window_and_a_limit_end_their_schedules_and_say_so_once(
    redis_url: str, redis_client: redis.Redis, tmp_path: Path
) -> None:
    start = _aligned(redis_client, 500, 1_500)
    end = start + timedelta(milliseconds=1_600)
    schedules = [
        {"every": "500ms", "name": "windowed", "start": start.isoformat(), "end": end.isoformat()},
        {"every": "500ms", "name": "three-times", "limit": 3},
    ]
    # Given two worker processes with a schedule in a 1.6 s window and one limited to 3 runs
    with policy_workers(redis_url, redis_client, 2, schedules, tmp_path):
        # When they run well past both
        assert wait_for(
            lambda: _ended(redis_url, "windowed") == "end" and _ended(redis_url, "three-times") == "limit",
            timeout=15,
        ), [_ended(redis_url, n) for n in ("windowed", "three-times")]
        time.sleep(1.2)
        infos = {n: _info(redis_url, n) for n in ("windowed", "three-times")}
    begin = int(start.timestamp() * 1000)
    # Then the windowed one ran at each tick within it and none outside
    assert [r["tick"] for r in _runs(redis_client, "windowed")] == [begin + k * 500 for k in range(4)]
    # and the limited one ran 3 times
    assert len(_runs(redis_client, "three-times")) == 3
    # and both say they ended, with nothing scheduled
    windowed, limited = infos["windowed"], infos["three-times"]
    assert (windowed.ended, windowed.next_due_ms, windowed.end_ms) == ("end", None, begin + 1_600)
    assert (limited.ended, limited.next_due_ms, limited.runs, limited.runs_left) == ("limit", None, 3, 0)
    # and each was said once, by one process of the fleet
    said = _logs(tmp_path)
    assert said.count("Schedule 'windowed' has ended") == 1, said
    assert said.count("Schedule 'three-times' has ended: it ran its limit of 3 run(s)") == 1, said


# -- bad values -----------------------------------------------------------------------


def test_bad_policy_values_are_refused_at_declaration_all_named_in_one_error_with_nothing_written(
    broker: RedissonBroker, redis_client: redis.Redis
) -> None:
    @dramatiq.actor
    def refused() -> None: ...

    broker.declare_queue("default")
    before = sorted(redis_client.keys("*"))
    with pytest.raises(InvalidSchedule) as info:
        periodic(
            every="1s",
            name="refused",
            overlap="replace",
            jitter=5,
            start_deadline="-1s",
            start=datetime(2030, 1, 1),  # naive
            end="tomorrow",
            limit=0,
        )(refused)
    message = str(info.value)
    assert message.startswith("6 bad values: "), message
    for part in (
        "overlap: expected one of 'allow', 'skip', got 'replace'",
        'jitter=5 has no unit: write jitter=timedelta(seconds=5) or jitter="5s"',
        "start_deadline:",
        "start: 2030-01-01T00:00:00 has no time zone",
        "end: expected an aware datetime, got 'tomorrow'",
        "limit: expected a whole number of runs, at least 1, got 0",
    ):
        assert part in message, (part, message)
    with pytest.raises(InvalidSchedule, match=r"jitter: must be shorter than the shortest time between two ticks"):
        periodic(cron="*/5 * * * *", name="refused", jitter=timedelta(minutes=5))(refused)
    aware = datetime(2030, 1, 1, tzinfo=timezone.utc)
    with pytest.raises(InvalidSchedule, match="end: must be after start"):
        periodic(every="1s", name="refused", start=aware, end=aware)(refused)
    # Then nothing was declared, and nothing written
    assert "refused" not in broker.schedules.declared()
    assert not any(isinstance(m, PeriodicStartDeadline) for m in broker.middleware)
    assert sorted(redis_client.keys("*")) == before
    # and a worker that starts stores no schedule
    worker = Worker(broker, worker_threads=1)
    worker.start()
    try:
        assert wait_for(lambda: redis_client.exists("dramatiq:__heartbeats__"), timeout=5)
        time.sleep(0.3)
    finally:
        worker.stop()
    assert broker.schedules.list() == []
    assert redis_client.exists("redisson_delay_queue_schedules:{dramatiq:default}") == 0


def test_policies_are_stored_listed_and_a_schedule_without_them_keeps_its_definition(
    broker: RedissonBroker, redis_client: redis.Redis
) -> None:
    @periodic(every="1h", name="plain-policy")
    @periodic(
        every="1h",
        name="full-policy",
        overlap="skip",
        jitter="90s",
        start_deadline=timedelta(minutes=5),
        start=datetime(2030, 1, 1, tzinfo=timezone.utc),
        end=datetime(2031, 1, 1, tzinfo=timezone.utc),
        limit=10,
    )
    @dramatiq.actor
    def policed() -> None: ...

    worker = Worker(broker, worker_threads=1)
    worker.start()
    try:
        broker.schedules.wait_until_stored(["plain-policy", "full-policy"])
    finally:
        worker.stop()
    full, plain = broker.schedules.get("full-policy"), broker.schedules.get("plain-policy")
    begin = int(datetime(2030, 1, 1, tzinfo=timezone.utc).timestamp() * 1000)
    assert (full.overlap, full.jitter_ms, full.start_deadline_ms, full.limit, full.runs_left) == (
        "skip",
        90_000,
        300_000,
        10,
        10,
    )
    assert (full.start_ms, full.end_ms) == (begin, int(datetime(2031, 1, 1, tzinfo=timezone.utc).timestamp() * 1000))
    # The first tick is the window's start (every 1 h from it), due at its jitter
    assert full.next_due_ms == begin + jitter_offset("full-policy", begin, 90_000)
    assert full.policy_text() == "overlap=skip jitter=90s start_deadline=300s limit=10"
    assert (plain.overlap, plain.jitter_ms, plain.limit, plain.skipped, plain.dropped, plain.ended) == (
        "allow",
        None,
        None,
        0,
        0,
        None,
    )
    stored = json.loads(redis_client.hget("redisson_delay_queue_schedules:{dramatiq:default}", "plain-policy"))
    assert set(stored) == {"actor", "anchor", "args", "catch_up", "kwargs", "spec", "version"}
