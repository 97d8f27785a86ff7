"""The transfer timer's decisions, driven tick by tick with an injected clock."""

from __future__ import annotations

import math
import time
from typing import Any

import dramatiq
import pytest

from dramatiq_redisson import RedissonBroker, _consumer
from dramatiq_redisson._consumer import MAX_UPKEEP_DEFER
from dramatiq_redisson._subscription import POLL_MARGIN_MS
from dramatiq_redisson._timer import ERROR_MARGIN, TransferTimer
from dramatiq_redisson.scripts._calls import TransferResult


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def timer(clock: FakeClock) -> TransferTimer:
    return TransferTimer(safety_interval_ms=5000, clock=clock)


def result(next_due_ms: int | None, server_now_ms: int = 1_000_000, extra_us: int = 0) -> TransferResult:
    return TransferResult(moved=0, next_due_ms=next_due_ms, server_now_us=server_now_ms * 1000 + extra_us, dead=0)


def test_timer_is_due_before_the_first_transfer(timer: TransferTimer) -> None:
    # Given a new timer
    # Then the first tick runs a transfer (the one on subscribe)
    assert timer.is_due()
    assert timer.seconds_until_due() == 0


def test_timer_waits_for_the_returned_due_time_on_the_server_clock(timer: TransferTimer, clock: FakeClock) -> None:
    # Given a transfer that says the head is due 1500 ms after the server's now
    timer.record(result(next_due_ms=1_001_500, server_now_ms=1_000_000))
    # Then the timer waits exactly that long on the local monotonic clock
    assert not timer.is_due()
    assert timer.seconds_until_due() == pytest.approx(1.5)
    clock.now += 1.499
    assert not timer.is_due()
    clock.now += 0.001
    assert timer.is_due()


def test_timer_ignores_a_skewed_local_wall_clock(clock: FakeClock) -> None:
    # Given two timers whose servers report wildly different epochs (as if the
    # worker's wall clock were off by an hour, which the timer never reads)
    a = TransferTimer(5000, clock=clock)
    b = TransferTimer(5000, clock=clock)
    a.record(result(next_due_ms=2_000, server_now_ms=1_000))
    b.record(result(next_due_ms=3_600_000 + 2_000, server_now_ms=3_600_000 + 1_000))
    # Then both wait the same time: only the server's difference matters
    assert a.seconds_until_due() == b.seconds_until_due() == pytest.approx(1.0)


def test_timer_announcement_of_an_earlier_due_time_moves_the_deadline_up(
    timer: TransferTimer, clock: FakeClock
) -> None:
    # Given a timer waiting 10 s for the head
    timer.record(result(next_due_ms=1_010_000, server_now_ms=1_000_000))
    clock.now += 1.0
    # When an offer announces a head due 500 ms from the server's now (1_001_000)
    timer.announce(1_001_500)
    # Then the timer fires in 500 ms
    assert timer.seconds_until_due() == pytest.approx(0.5)


def test_timer_announcement_of_a_later_due_time_changes_nothing(timer: TransferTimer) -> None:
    timer.record(result(next_due_ms=1_001_000, server_now_ms=1_000_000))
    timer.announce(1_009_000)
    assert timer.seconds_until_due() == pytest.approx(1.0)


def test_timer_announcement_of_a_past_due_time_fires_now(timer: TransferTimer) -> None:
    timer.record(result(next_due_ms=None))
    timer.announce(999_000)
    assert timer.is_due()


def test_timer_safety_interval_bounds_every_wait(timer: TransferTimer, clock: FakeClock) -> None:
    # Given nothing scheduled (so nothing to wait for but announcements)
    timer.record(result(next_due_ms=None))
    assert timer.seconds_until_due() == pytest.approx(5.0)
    # When no announcement arrives (lost subscription)
    clock.now += 5.0
    # Then the safety check runs a transfer anyway
    assert timer.is_due()


def test_timer_force_runs_at_the_next_tick(timer: TransferTimer) -> None:
    timer.record(result(next_due_ms=None))
    timer.force()
    assert timer.is_due()
    assert timer.seconds_until_due() == 0


def test_timer_estimates_the_server_clock_from_the_last_transfer(timer: TransferTimer, clock: FakeClock) -> None:
    assert timer.server_now_ms() == 0
    timer.record(result(next_due_ms=None, server_now_ms=50_000))
    clock.now += 2.5
    assert timer.server_now_ms() == 52_500


def test_timer_schedules_from_the_servers_microseconds(timer: TransferTimer) -> None:
    # Given a transfer run 0.6 ms into server millisecond 1_000_000, head due at 1_001_000
    timer.record(result(next_due_ms=1_001_000, server_now_ms=1_000_000, extra_us=600))
    # Then the timer waits 999.4 ms, not a whole second (the entry moves at 1_001_000.000)
    assert timer.seconds_until_due() == pytest.approx(0.9994)


def record_call(timer: TransferTimer, clock: FakeClock, took: float, reply: TransferResult) -> None:
    """A transfer call that took ``took`` seconds from its start (now) to ``reply``."""
    started = clock.now
    clock.now += took
    timer.record(reply, started)


def test_timer_takes_the_servers_now_at_the_middle_of_the_call(timer: TransferTimer, clock: FakeClock) -> None:
    # Given a transfer sent 1 ms before its reply came, whose server read 1_000_000 ms
    # (somewhere in that millisecond of the call), head due 10 ms later
    record_call(timer, clock, 0.001, result(next_due_ms=1_000_010, server_now_ms=1_000_000))
    # Then the server's now is placed half a call before the reply, not at the reply, and
    # the deadline gets half of that sample's error (0.25 ms): the timer waits 9.75 ms, not
    # 10 ms (which made every transfer late by the reply's way back)
    assert timer.seconds_until_due() == pytest.approx(0.0095 + ERROR_MARGIN * 0.0005)
    assert timer.server_now_ms() == 1_000_000  # 1_000_000.5 ms


def test_timer_keeps_its_tightest_sample_of_the_server_clock(timer: TransferTimer, clock: FakeClock) -> None:
    # Given a quick call (0.2 ms) that read the server at 1_000_000.000 ms at its middle
    record_call(timer, clock, 0.0002, result(next_due_ms=None, server_now_ms=1_000_000))
    # When, 1 s later, a slow call (10 ms: the process was busy) reads 1_001_001.0 ms at
    # its start: consistent with the first within its 5 ms error, but its middle says
    # 4.1 ms less than the first sample does
    clock.now += 1.0
    record_call(timer, clock, 0.010, result(next_due_ms=1_001_020, server_now_ms=1_001_001))
    # Then the deadline comes from the quick sample: the head, due at 1_001_020.0 ms, is
    # 1.02 s after the first sample's middle (100.0001), at 101.0201 (the slow sample
    # alone would say 101.0242)
    assert timer.seconds_until_due() == pytest.approx(101.0201 + ERROR_MARGIN * 0.0001 - clock.now, abs=1e-6)


def test_timer_follows_a_stepped_server_clock(timer: TransferTimer, clock: FakeClock) -> None:
    # Given a tight sample of the server's clock
    record_call(timer, clock, 0.0002, result(next_due_ms=None, server_now_ms=1_000_000))
    # When a later call finds the server's clock 2 s ahead of it (stepped, or a failover
    # onto a server whose clock differs), beyond both samples' errors
    clock.now += 0.5
    record_call(timer, clock, 0.001, result(next_due_ms=1_002_600, server_now_ms=1_002_500))
    # Then the new sample replaces the old one at once
    assert timer.seconds_until_due() == pytest.approx(0.0995 + ERROR_MARGIN * 0.0005)


def test_ready_announcement_wakes_a_consumer_without_a_transfer(broker: RedissonBroker) -> None:
    # Given a consumer whose timer has nothing due for a while
    consumer = broker.consume("default", prefetch=1, timeout=100)
    consumer.timer.record(result(next_due_ms=None))
    consumer.pacing.misses = 5
    # When enqueue.lua announces a message landing in an empty ready queue ("0")
    consumer.duty.handle({"type": "message", "data": b"0"})
    # Then the consumer fetches at once (no back-off) but runs no transfer for it
    assert consumer.pacing.misses == 0
    assert not consumer.timer.is_due()
    # While a due time still moves the timer
    consumer.duty.handle({"type": "message", "data": b"999000"})
    assert consumer.timer.is_due()
    consumer.close()


def test_the_earliest_of_the_announcements_heard_at_once_moves_the_timer(broker: RedissonBroker) -> None:
    # Given a consumer whose timer has nothing due for a while (standing by: another
    # consumer holds the lease for 10 s)
    consumer = broker.consume("default", prefetch=1, timeout=100)
    try:
        consumer.timer.record(
            TransferResult(moved=0, next_due_ms=None, server_now_us=10**9, dead=0, lease_until_ms=10**6 + 10_000)
        )
        now_ms = consumer.timer.server_now_ms()
        # When its subscription hears three announcements in one drain, the earliest second
        subscription = consumer.duty.subscription
        heard = 0
        for due_ms in (now_ms + 5000, now_ms + 2000, 0):
            heard |= subscription.handle({"type": "message", "data": str(due_ms).encode()})
        consumer.pacing.misses = 5
        consumer.duty.act(heard)
        # Then the timer is due at the earliest, the next short fetch backs off from
        # scratch, and nothing is left over for the next drain
        assert consumer.timer.seconds_until_due() == pytest.approx(2.0, abs=0.1)
        assert consumer.pacing.misses == 0
        assert subscription.take_announced() == 0
    finally:
        consumer.close()


def test_timer_retries_a_failed_transfer_after_the_back_off_not_at_once(timer: TransferTimer, clock: FakeClock) -> None:
    # Given a forced transfer (a new timer) that failed
    assert timer.is_due()
    timer.retry_in(400)
    # Then the next attempt waits the back-off instead of spinning
    assert not timer.is_due()
    assert timer.seconds_until_due() == pytest.approx(0.4)
    clock.now += 0.4
    assert timer.is_due()


def test_lease_holder_transfers_at_least_every_third_of_the_lease(clock: FakeClock) -> None:
    # Given a holder of a 2 s lease (safety interval 5 s) with nothing scheduled
    timer = TransferTimer(5000, clock=clock, lease_ms=2000)
    timer.record(result(next_due_ms=None))
    # Then it transfers again (renewing the lease) within a third of the lease
    assert timer.owner
    assert timer.seconds_until_due() == pytest.approx(0.666)


def test_standby_checks_the_lease_when_it_would_end_plus_jitter(clock: FakeClock) -> None:
    # Given a consumer told that another one holds the lease until 1.2 s from now
    timer = TransferTimer(5000, clock=clock, lease_ms=2000, jitter=lambda: 0.5)
    standby = TransferResult(moved=0, next_due_ms=None, server_now_us=1_000_000_000, dead=0, lease_until_ms=1_001_200)
    timer.record(standby)
    # Then it checks again at the lease's end plus its jitter (half of 10 % of the lease),
    # and neither an announcement nor a force is lost on it
    assert not timer.owner
    assert timer.seconds_until_due() == pytest.approx(1.2 + 0.1)
    timer.announce(1_000_500)
    assert timer.seconds_until_due() == pytest.approx(0.5)


def _settled(consumer: Any) -> None:
    """Tick until the consumer holds the lease, its subscriptions are confirmed (each
    confirmation forces a transfer) and nothing is due."""
    deadline = time.monotonic() + 5
    while True:
        assert time.monotonic() < deadline, "the consumer did not settle"
        consumer.tick()
        time.sleep(0.05)
        consumer.duty.drain()
        if consumer.duty.wake_ready and consumer.timer.owner and not consumer.timer.is_due():
            return


class _UpkeepSpy:
    """Counts the upkeep runs of one consumer (its own method, wrapped)."""

    def __init__(self, consumer: Any) -> None:
        self.runs = 0
        self.upkeep = consumer.run_upkeep
        consumer.run_upkeep = self

    def __call__(self, now: float) -> None:
        self.runs += 1
        self.upkeep(now)


def test_upkeep_waits_for_a_gap_between_due_times(broker: RedissonBroker, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given the lease holder of a queue with nothing scheduled, settled (the gap it needs
    # made 50 ms, so that the test's own steps fit well inside it)
    monkeypatch.setattr(_consumer, "UPKEEP_GAP", 50)
    consumer = broker.consume("default", prefetch=1, timeout=100)
    try:
        _settled(consumer)
        spy = _UpkeepSpy(consumer)
        # When a due time is announced 30 ms ahead (closer than UPKEEP_GAP)
        consumer.duty.handle({"type": "message", "data": str(consumer.timer.server_now_ms() + 30).encode()})
        consumer.tick()
        # Then the tick leaves the upkeep (checks, heartbeat, maintenance) for later
        assert spy.runs == 0
        # And once that due time has passed (its transfer done, nothing else due), it runs
        time.sleep(0.04)
        consumer.tick()
        assert spy.runs == 1
    finally:
        consumer.close()


def test_upkeep_waits_no_longer_than_max_upkeep_defer(broker: RedissonBroker, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given the lease holder of a queue where a message comes due every 10 ms for 1.5 s
    # (with UPKEEP_GAP made 50 ms, a due time is always too close for the upkeep)
    monkeypatch.setattr(_consumer, "UPKEEP_GAP", 50)

    @dramatiq.actor(queue_name="default")
    def tick_tock() -> None:
        pass

    consumer = broker.consume("default", prefetch=1000, timeout=100)
    try:
        _settled(consumer)
        for i in range(150):
            tick_tock.send_with_options(delay=200 + 10 * i)
        spy = _UpkeepSpy(consumer)
        # When the consumer ticks on (taking what its transfers hand off), from the first
        # tick that leaves the upkeep for later
        deferred_since = None
        started = time.monotonic()
        while time.monotonic() - started < 2.0:
            consumer.tick()
            consumer.message_cache.clear()
            if deferred_since is None:
                deferred_since = consumer.upkeep_deferred_since
                spy.runs = 0
            elif spy.runs:
                break
            time.sleep(0.001)
        # Then the upkeep waited, but ran within MAX_UPKEEP_DEFER of that first wait
        assert deferred_since is not None
        assert spy.runs == 1
        waited = time.monotonic() - deferred_since
        assert MAX_UPKEEP_DEFER / 1000 <= waited < MAX_UPKEEP_DEFER / 1000 + 0.2
    finally:
        consumer.close()


def test_a_wait_for_the_timer_ends_at_its_deadline_not_a_rounded_millisecond_later(
    broker: RedissonBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given the settled lease holder of a queue, and a due time announced ~10.5 ms ahead
    consumer = broker.consume("default", prefetch=1, timeout=100)
    try:
        _settled(consumer)
        consumer.duty.handle({"type": "message", "data": str(consumer.timer.server_now_ms() + 11).encode()})
        listened: list[float] = []
        get_message = consumer.duty.subscription.pubsub.get_message

        def spy(timeout: float = 0.0) -> Any:
            listened.append(timeout)
            return get_message(timeout=timeout)

        monkeypatch.setattr(consumer.duty.subscription.pubsub, "get_message", spy)
        seconds = consumer.timer.seconds_until_due()
        deadline = time.monotonic() + seconds
        # When the consumer waits for it
        consumer.duty.wait(seconds)
        # Then it listened for whole milliseconds ending at least POLL_MARGIN_MS before the
        # deadline (a socket timeout is rounded up to the next millisecond), slept the rest,
        # and woke at the deadline, not before
        assert listened[0] == pytest.approx(math.floor(seconds * 1000 - POLL_MARGIN_MS) / 1000)
        assert listened[0] <= seconds - POLL_MARGIN_MS / 1000
        assert time.monotonic() >= deadline
        assert consumer.timer.is_due()
    finally:
        consumer.close()
