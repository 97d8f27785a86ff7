"""The consumer's pacing: when it fetches, how many, and how long it waits otherwise.
Free of I/O, as :mod:`._timer` is for the transfer timer, so tests drive it event by event.

:class:`Pacing` holds what the consumer's fetch loop decides by: whether the consumer is
listed in the idle registry (and with what score), whether its last fetch saw more
messages ready than it took (every thread of the fleet is busy), whether a wake-up waits
for an answer, whether the queue is paused, the back-off of short fetches, and when the
next idle poll and the next rate-limited start are. The consumer tells it what happened
(a fetch's result, a listing, a wake-up, an announcement) and asks it what to do next:
:meth:`Pacing.next_step` returns a :class:`Fetch` or a :class:`Wait`, and after a fetch
that brought nothing, :meth:`Pacing.after_short_fetch` says how to wait. The consumer
carries the steps out (``_consumer.RedissonConsumer.__next__``); the placement of messages
that these steps take part in is followed end to end in ``docs/placement.md``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from dramatiq.common import compute_backoff

#: While its queue is paused, how often (ms) a consumer asks whether it was resumed (its
#: fetch does): a resume starts processing within about this long.
PAUSE_POLL_INTERVAL = 250

#: While every thread is busy and it is not listed as idle, the lease holder waits for a
#: thread in slices this long (ms), handling what its subscription received in between
#: (an earlier due time announced meanwhile moves at most this late).
BUSY_LISTEN = 5


@dataclass(frozen=True)
class Fetch:
    """Fetch up to ``count`` ready messages. ``listed``: the fetch lists the consumer in
    the idle registry with what it can start still; else (filling its prefetch behind busy
    threads, see :attr:`Pacing.backlog`) it leaves the listing alone, and a fetch that
    brings nothing needs no :meth:`Pacing.after_short_fetch`."""

    count: int
    listed: bool = True


@dataclass(frozen=True)
class Wait:
    """Wait up to ``seconds``.

    ``on``: ``"wake"``, on the subscription (a wake-up or an announcement ends it); or
    ``"thread"``, for one of the Worker's threads to free up (the consumer checks again
    that none is free before it waits, and handles what its subscription received after).
    ``then``: ``"return"``, give Dramatiq's consumer thread back (``__next__`` returns
    None); ``"return_if_listed"``, the same unless a wake-up unlisted the consumer during
    the wait (then fetch); ``"continue"``, go round the loop again."""

    seconds: float
    on: Literal["wake", "thread"]
    then: Literal["return", "return_if_listed", "continue"] = "continue"


Step = Fetch | Wait


class Pacing:
    """The decisions of a consumer's fetch loop (see the module).

    Parameters:
      timeout_ms: The Worker's ``worker_timeout``: the longest wait, and how often a
        consumer listed as idle polls (a wake-up may be lost).
      poll_interval_ms: How long after a listing the consumer polls although it is listed
        with room (``min(timeout, safety_interval)``, times a shard's turns).

    No clock is read here: the methods that need the time take ``now`` (monotonic s).
    """

    def __init__(self, timeout_ms: int, poll_interval_ms: float) -> None:
        self.timeout_ms = timeout_ms
        self.timeout = timeout_ms / 1000
        self.poll_interval = poll_interval_ms / 1000
        #: Listed in the idle registry by the last fetch or transfer: it waits for a
        #: wake-up instead of polling.
        self.registered = False
        #: The score it is listed with in the idle registry (what it could start then).
        self.idle_score = 0
        #: How many times it was listed or taken out: an ack that began at another listing
        #: does not take its score as the listing's (see :meth:`acked`).
        self.listing = 0
        #: When (monotonic s) a consumer listed with room polls all the same.
        self.idle_poll_at = 0.0
        #: The last fetch took all it asked for and more were ready: every thread of the
        #: fleet is busy, so it fills its prefetch as Dramatiq's consumers do (a thread that
        #: frees up starts the next message without a round trip) until a fetch comes up
        #: short.
        self.backlog = False
        #: A wake-up came and no fetch answered it yet.
        self.answer_wake = False
        #: The last fetch found the queue paused (see pause.lua): poll, start nothing.
        self.paused = False
        #: Short fetches in a row while not listed: the back-off's exponent.
        self.misses = 0
        #: When a rate limit allows the next start (monotonic s), if this consumer is the
        #: one told to fetch again then (fetch.lua).
        self.next_start_at = 0.0

    # -- events ------------------------------------------------------------------------

    def listed(self, now: float, registered: bool, score: int = 0) -> None:
        """A script listed the consumer in the idle registry with ``score`` (what it can
        start still), or took it out (``registered`` False)."""
        self.registered = registered
        self.idle_score = score if registered else 0
        self.listing += 1
        if registered:
            self.idle_poll_at = now + self.poll_interval

    def fetched(
        self,
        now: float,
        *,
        more: bool,
        listed: bool,
        registered: bool = False,
        score: int = 0,
        wait_ms: int | None = None,
    ) -> None:
        """A fetch ran: ``more`` messages were ready than it took; ``listed``: it listed the
        consumer (``registered``) with ``score``; ``wait_ms``: a rate limit holds messages
        back and this consumer is the one to fetch again after that long."""
        self.paused = False
        self.backlog = more
        self.answer_wake = False
        if listed:
            self.listed(now, registered, score)
        if wait_ms is not None:
            self.next_start_at = now + wait_ms / 1000
            if self.registered:
                self.idle_poll_at = min(self.idle_poll_at, self.next_start_at)

    def fetched_paused(self) -> None:
        """A fetch found the queue paused: it took nothing and listed nobody."""
        self.paused = True
        self.registered = False
        self.listing += 1

    def took(self) -> None:
        """Messages came (a fetch's, or a transfer's hand-off): back off from scratch."""
        self.misses = 0

    def woken(self) -> None:
        """A wake-up came (or the wake channel was subscribed): fetch now, and be listed
        again if the fetch comes up short (the wake-up took it out of the registry)."""
        self.registered = False
        self.idle_score = 0
        self.listing += 1
        self.misses = 0
        self.answer_wake = True

    def announced(self) -> None:
        """Something was announced on the queue: the next short fetch backs off from scratch."""
        self.misses = 0

    def acked(self, began: int, score: int) -> None:
        """An ack listed the consumer with ``score``, its thread free again (``began``: the
        :attr:`listing` when the ack began): unless it was listed anew or taken out
        meanwhile, that is its score now. A fetch that crossed the ack listed it after
        the ack's write (with the score it saw then, maybe the same as before: a
        comparison of scores cannot tell, and a consumer that believed itself listed
        with room while the registry said 0 was woken by nobody until its poll)."""
        if self.registered and self.listing == began:
            self.idle_score = score

    # -- decisions ----------------------------------------------------------------------

    def next_step(
        self,
        now: float,
        *,
        can_start: int,
        free_slots: int,
        backlog_room: Callable[[], int],
        until_due: float,
        hears_announcements: bool,
    ) -> Step:
        """What to do with nothing cached: ``can_start`` messages its threads can start now,
        ``free_slots`` its prefetch has room for, ``backlog_room()`` how many to queue
        behind busy threads, ``until_due`` (s) the transfer timer's next due time;
        ``hears_announcements``: it holds the lease and is subscribed (a wait for a
        thread is cut in :data:`BUSY_LISTEN` ms slices to hear them)."""
        can = can_start
        if can == 0 and self.answer_wake and free_slots > 0:
            # Woken for a message while its threads turned busy (a listing that lagged:
            # another queue's consumer took them): take one all the same, behind them,
            # rather than leave it to a poll.
            can = 1
        if can == 0 and self.backlog:
            depth = backlog_room()
            if depth > 0:
                return Fetch(depth, listed=False)
        before_poll = self.idle_score > 0 and now < self.idle_poll_at
        if self.registered and not self.backlog and (can == 0 or before_poll):
            # Listed as idle: a wake-up ends the wait; no polling. Listed at 0 (every
            # thread busy), it waits the same way: the ack that frees a thread lists it
            # again, or wakes it when messages wait (ack.lua). Not while its last fetch saw
            # more messages ready (backlog): no enqueue or transfer is coming to wake it for
            # them, and its listing may lag what it can start (see relist), so an ack need
            # not wake it either: it fetches now, or when a thread frees up (below).
            wait = self.timeout if can == 0 else min(self.timeout, self.idle_poll_at - now)
            return Wait(min(wait, until_due), "wake", "return_if_listed")
        if can > 0:
            return Fetch(can)
        # Every thread busy (or the prefetch full), and not listed: wait for a thread to
        # free up, or for the timer.
        wait = min(self.timeout, until_due)
        if hears_announcements:
            wait = min(wait, BUSY_LISTEN / 1000)
        return Wait(wait, "thread")

    def after_short_fetch(self, now: float, *, until_due: float) -> Wait | None:
        """A listed :class:`Fetch` brought nothing: how to wait (None: go round the loop,
        to wait for a wake-up as listed)."""
        if self.paused:
            return Wait(min(PAUSE_POLL_INTERVAL / 1000, until_due), "wake", "return")
        if self.registered:
            return None
        self.misses, backoff_ms = compute_backoff(self.misses, max_backoff=self.timeout_ms)
        wait = min(backoff_ms / 1000, max(0.0, self.next_start_at - now) or math.inf)
        return Wait(min(wait, until_due), "wake")
