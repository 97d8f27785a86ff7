"""The transfer timer's decisions, driven tick by tick with an injected clock."""

from __future__ import annotations

import pytest

from dramatiq_redisson import RedissonBroker
from dramatiq_redisson._scripts import TransferResult
from dramatiq_redisson._timer import TransferTimer


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


def test_ready_announcement_wakes_a_consumer_without_a_transfer(broker: RedissonBroker) -> None:
    # Given a consumer whose timer has nothing due for a while
    consumer = broker.consume("default", prefetch=1, timeout=100)
    consumer.timer.record(result(next_due_ms=None))
    consumer.misses = 5
    # When enqueue.lua announces a message landing in an empty ready queue ("0")
    consumer.transfers.handle({"type": "message", "data": b"0"})
    # Then the consumer fetches at once (no back-off) but runs no transfer for it
    assert consumer.misses == 0
    assert not consumer.timer.is_due()
    # While a due time still moves the timer
    consumer.transfers.handle({"type": "message", "data": b"999000"})
    assert consumer.timer.is_due()
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
