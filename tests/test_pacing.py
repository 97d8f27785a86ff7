"""The consumer's pacing (``_pacing.Pacing``), event by event, with no server: each test is
a table of (event, then the step it must decide). The cases the consumer loop got wrong
before are here by name: the burst stall of issue 48, the wake-up that found its threads
busy, the crossing fetch and ack of issue 46."""

from __future__ import annotations

from typing import Any

import pytest

from dramatiq_redisson._pacing import BUSY_LISTEN, PAUSE_POLL_INTERVAL, Fetch, Pacing, Wait
from dramatiq_redisson._worker_threads import relist

TIMEOUT_MS = 1000
POLL_MS = 1000
FAR = 60.0  # the transfer timer's next due time, when it is far


def pacing() -> Pacing:
    return Pacing(TIMEOUT_MS, POLL_MS)


def step(p: Pacing, now: float = 0.0, **given: Any) -> Fetch | Wait:
    """``next_step`` with what a consumer of 4 idle threads would pass, unless ``given``."""
    room = given.pop("backlog_room", 0)
    args: dict[str, Any] = {
        "can_start": 4,
        "free_slots": 4,
        "backlog_room": lambda: room,
        "until_due": FAR,
        "hears_announcements": False,
    }
    args.update(given)
    return p.next_step(now, **args)


# -- fetching ---------------------------------------------------------------------------


def test_a_new_consumer_fetches_what_its_threads_can_start_and_lists_itself() -> None:
    assert step(pacing(), can_start=3) == Fetch(3, listed=True)


def test_a_short_fetch_while_listed_waits_for_a_wake_up_then_polls_after_the_poll_interval() -> None:
    p = pacing()
    # The fetch brought nothing and listed the consumer with 4 threads free
    p.fetched(10.0, more=False, listed=True, registered=True, score=4)
    assert p.after_short_fetch(10.0, until_due=FAR) is None  # round the loop: wait as listed
    # Listed with room, before its poll time: a wait on the subscription until then
    assert step(p, 10.25) == Wait(pytest.approx(0.75), "wake", "return_if_listed")
    # At its poll time it fetches again although nothing woke it (a wake-up may be lost)
    assert step(p, 11.0) == Fetch(4)


def test_the_timer_cuts_every_wait_short() -> None:
    p = pacing()
    p.fetched(0.0, more=False, listed=True, registered=True, score=4)
    assert step(p, 0.0, until_due=0.002).seconds == 0.002
    p.listed(0.0, False)
    assert step(p, 0.0, can_start=0, free_slots=0, until_due=0.003) == Wait(0.003, "thread")


def test_listed_at_zero_it_waits_a_whole_timeout_for_the_ack_that_relists_or_wakes_it() -> None:
    p = pacing()
    p.fetched(0.0, more=False, listed=True, registered=True, score=0)
    assert step(p, 0.5, can_start=0, free_slots=0) == Wait(TIMEOUT_MS / 1000, "wake", "return_if_listed")


def test_not_listed_and_every_thread_busy_it_waits_for_a_thread_in_slices_when_it_hears_announcements() -> None:
    p = pacing()
    assert step(p, can_start=0, free_slots=0) == Wait(TIMEOUT_MS / 1000, "thread")
    assert step(p, can_start=0, free_slots=0, hears_announcements=True) == Wait(BUSY_LISTEN / 1000, "thread")


# -- the burst stall (issue 48) -----------------------------------------------------------


def test_burst_a_listed_consumer_whose_fetch_saw_more_ready_fills_behind_busy_threads() -> None:
    # Given a consumer listed in the idle registry whose last fetch took all it asked
    # for, with more messages ready (a burst due at once: every thread of the fleet busy)
    p = pacing()
    p.fetched(0.0, more=True, listed=True, registered=True, score=0)
    # Then, with every thread busy, it queues messages behind them (not listed: the
    # listing is left alone) instead of waiting for a wake-up that no one sends
    assert step(p, 0.1, can_start=0, free_slots=4, backlog_room=2) == Fetch(2, listed=False)
    # and when a thread frees up it fetches at once, although it is listed
    assert step(p, 0.2, can_start=1, free_slots=1) == Fetch(1)
    # With its backlog queued (no room left), it waits for a thread, not for a wake-up
    assert step(p, 0.3, can_start=0, free_slots=0, backlog_room=0) == Wait(TIMEOUT_MS / 1000, "thread")
    # Once a fetch comes up short the burst is over: listed, it waits for wake-ups again
    p.fetched(0.4, more=False, listed=True, registered=True, score=1)
    assert step(p, 0.5, can_start=1) == Wait(pytest.approx(0.9), "wake", "return_if_listed")


def test_a_backlog_fetch_that_brings_nothing_goes_round_the_loop_without_backing_off() -> None:
    p = pacing()
    p.fetched(0.0, more=True, listed=True, registered=True, score=0)
    assert step(p, can_start=0, backlog_room=3) == Fetch(3, listed=False)
    p.fetched(0.1, more=False, listed=False)
    assert (p.backlog, p.registered, p.misses) == (False, True, 0)  # the listing stays


# -- wake-ups ---------------------------------------------------------------------------------


def test_a_wake_up_that_finds_every_thread_busy_takes_one_message_all_the_same() -> None:
    # Given a consumer woken for a message while its threads turned busy (its listing
    # lagged: another queue's consumer took them), with room in its prefetch
    p = pacing()
    p.fetched(0.0, more=False, listed=True, registered=True, score=1)
    p.woken()
    # Then it fetches one, behind its threads, rather than leave it to a poll
    assert step(p, 0.1, can_start=0, free_slots=2) == Fetch(1)
    # Not with a full prefetch
    assert step(p, 0.1, can_start=0, free_slots=0) == Wait(TIMEOUT_MS / 1000, "thread")
    # and the fetch answers the wake-up
    p.fetched(0.2, more=False, listed=True, registered=True, score=0)
    assert step(p, 0.3, can_start=0, free_slots=2) == Wait(TIMEOUT_MS / 1000, "wake", "return_if_listed")


def test_a_wake_up_unlists_and_resets_the_back_off() -> None:
    p = pacing()
    p.misses = 6
    p.fetched(0.0, more=False, listed=True, registered=True, score=2)
    p.woken()
    assert (p.registered, p.misses) == (False, 0)
    assert step(p, 0.0, can_start=2) == Fetch(2)


# -- the crossing fetch and ack (issue 46) ----------------------------------------------------


def test_an_ack_relisting_keeps_its_score_only_if_no_fetch_listed_the_consumer_meanwhile() -> None:
    p = pacing()
    p.fetched(0.0, more=False, listed=True, registered=True, score=0)
    # An ack that began with the consumer listed at 0 relists it at 1
    p.acked(p.listing, 1)
    assert p.idle_score == 1
    # An ack began (listed at 1), a fetch crossed it and listed the consumer at 3: the
    # ack's relisting at 2, older than the fetch's, is not taken as the score
    began = p.listing
    p.fetched(0.1, more=False, listed=True, registered=True, score=3)
    p.acked(began, 2)
    assert p.idle_score == 3
    # Unlisted (woken) meanwhile: an ack does not list it again here
    began = p.listing
    p.woken()
    p.acked(began, 4)
    assert (p.registered, p.idle_score) == (False, 0)


def test_a_fetch_that_crosses_an_ack_and_lists_the_same_score_keeps_it() -> None:
    # Found by the workflow benchmark's fan-out (issue 57): listed at 0, an ack began and
    # relisted at 2 (its write ran first), a fetch crossed it and listed the consumer at 0
    # again on the server. Comparing scores (0 == 0) took the ack's 2 as the listing, so
    # the next acks (2 >= what they could start) wrote nothing, the registry kept 0, and
    # no enqueue woke the consumer until its poll, up to worker_timeout later.
    p = pacing()
    p.fetched(0.0, more=True, listed=True, registered=True, score=0)
    began = p.listing
    p.fetched(0.001, more=True, listed=True, registered=True, score=0)
    p.acked(began, 2)
    assert (p.registered, p.idle_score) == (True, 0)
    # so the next ack lists what it can start (relist from 0 always writes)
    assert relist(p.idle_score, 2, holder=False, long_jobs=False)


# -- back-off, rate limits, pause ---------------------------------------------------------------


def test_short_fetches_while_not_listed_back_off_exponentially_up_to_the_timeout() -> None:
    p = pacing()
    waits = []
    for _ in range(12):
        p.fetched(0.0, more=False, listed=True, registered=False, score=0)
        wait = p.after_short_fetch(0.0, until_due=FAR)
        assert wait is not None and wait.on == "wake" and wait.then == "continue"
        waits.append(wait.seconds)
    assert 0.005 <= waits[0] <= 0.010  # Dramatiq's backoff: 5 ms, jittered up to twice
    assert all(w <= TIMEOUT_MS / 1000 for w in waits) and waits[-1] >= TIMEOUT_MS / 2000
    # Messages that come reset it
    p.took()
    assert p.misses == 0


def test_a_rate_limited_consumer_fetches_again_when_the_next_start_is_allowed() -> None:
    p = pacing()
    p.misses = 10  # a long back-off, which the rate limit's wait cuts short
    p.fetched(0.0, more=False, listed=True, registered=False, wait_ms=40)
    wait = p.after_short_fetch(0.01, until_due=FAR)
    assert wait == Wait(pytest.approx(0.03), "wake")
    # Listed, its poll comes no later than the next allowed start
    p.fetched(1.0, more=False, listed=True, registered=True, score=2, wait_ms=100)
    assert p.idle_poll_at == pytest.approx(1.1)
    assert step(p, 1.05, can_start=2) == Wait(pytest.approx(0.05), "wake", "return_if_listed")


def test_a_paused_queue_is_polled_every_pause_interval_and_the_loop_returns() -> None:
    p = pacing()
    p.fetched(0.0, more=False, listed=True, registered=True, score=4)
    p.fetched_paused()
    assert (p.paused, p.registered) == (True, False)
    assert p.after_short_fetch(0.0, until_due=FAR) == Wait(PAUSE_POLL_INTERVAL / 1000, "wake", "return")
    # Resumed: the next fetch clears it
    p.fetched(0.3, more=False, listed=True, registered=True, score=4)
    assert not p.paused


def test_listing_with_room_sets_the_poll_time_and_unlisting_clears_the_score() -> None:
    p = Pacing(TIMEOUT_MS, 3 * POLL_MS)  # a shard that polls every third timeout
    p.listed(5.0, True, 2)
    assert (p.registered, p.idle_score, p.idle_poll_at) == (True, 2, 8.0)
    p.listed(6.0, False, 2)
    assert (p.registered, p.idle_score) == (False, 0)
