"""How many of a Dramatiq Worker's threads are free: where work should go (issue 46).

Dramatiq's prefetch bounds what a process *holds*; it says nothing of whether a thread is
free to start a message now. A consumer that takes messages up to its prefetch while its
threads are busy queues them behind running jobs, while threads of another process sit
idle. So a consumer that knows its Worker takes (by a transfer's hand-off or a fetch) at
most what its idle threads can start now, and its place in the queue's idle registry is
scored by that number, so that enqueues and transfers wake the consumer with the most
idle threads (see fetch.lua, transfer.lua, include/wake.lua and ack.lua).

A Worker's threads are shared by the consumers of all its queues: :class:`WorkerThreads`
counts what all of them hold (handed to Dramatiq and not finished, or fetched and not yet
handed over) against the Worker's ``worker_threads``, and tells every one of them when a
thread frees up. :class:`WorkerRegistry` finds the Worker of a consumer being built: the
consumer is built in the Worker's consumer thread, which carries the Worker's work queue.

A consumer built outside a Worker (a test, a custom runner) finds none, and takes up to
its prefetch, as before.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Mapping
from typing import Any, Protocol

#: A consumer listed in the idle registry with a score of at least 1 lists its new score
#: with an ack once it can start this many more than its score (a listed score only ever
#: lags: it was taken before threads freed up), while jobs are short (see
#: :attr:`WorkerThreads.long_jobs`); with longer jobs, at every thread freed. A score of 0
#: is raised by the first ack.
IDLE_SCORE_STEP = 2

#: Jobs that hold a thread this long (s) on average, from their hand-over to Dramatiq to
#: their end (the ack not counted), are placed across the fleet by idle threads (see
#: :attr:`WorkerThreads.long_jobs`): placing a message on another process costs a wake-up
#: and a fetch, a round trip or two, which short jobs would feel and longer ones do not.
#: Shorter jobs go to the lease holder while it has an idle thread (they free it soon).
SPREAD_JOBS_FROM = 0.005

#: Weight of the newest job in the running mean of how long jobs hold a thread.
JOB_TIME_WEIGHT = 0.1


def relist(score: int, after: int, *, holder: bool, long_jobs: bool) -> bool:
    """Whether a consumer listed with ``score`` that can start ``after`` once its ack is done
    lists its new score with that ack (see ack.lua). ``long_jobs``: jobs take long enough
    that a write more per job does not count (:attr:`WorkerThreads.long_jobs`): every change
    is listed. Else the transfer lease's holder raises only a 0 (it places what it moves
    by its own count, not by its listing: transfer.lua's Placement), and the others lag
    by less than :data:`IDLE_SCORE_STEP`, so that a no-op workload pays no write per
    message."""
    if after <= score:
        return False
    if score == 0 or long_jobs:
        return True
    return not holder and after - score >= IDLE_SCORE_STEP


class Holder(Protocol):
    """A consumer, as :class:`WorkerThreads` counts it."""

    @property
    def holding(self) -> int:
        """Messages it holds: handed to Dramatiq and not finished, or fetched and not yet
        handed over."""
        ...

    def thread_freed(self) -> None:
        """A thread of the Worker finished a message (any queue's)."""
        ...


class WorkerThreads:
    """The threads of one Dramatiq Worker, and the consumers that fill them."""

    def __init__(self, threads: int) -> None:
        self.threads = max(1, int(threads))
        self._holders: tuple[Holder, ...] = ()
        self._lock = threading.Lock()
        #: How long a message holds a thread (s), handed to Dramatiq to finished: a mean
        #: over the latest jobs (see :data:`JOB_TIME_WEIGHT`).
        self.job_seconds = 0.0

    def attach(self, holder: Holder) -> None:
        with self._lock:
            self._holders = (*self._holders, holder)

    def detach(self, holder: Holder) -> None:
        with self._lock:
            self._holders = tuple(h for h in self._holders if h is not holder)

    def busy(self) -> int:
        """Threads running (or about to run) a message: what the consumers hold."""
        return sum(h.holding for h in self._holders)

    def idle(self, finishing: int = 0) -> int:
        """Threads free to start a message now (``finishing``: as if that many of the
        messages held had finished)."""
        return max(0, self.threads - self.busy() + finishing)

    def room(self, free: int, finishing: int = 0, depth: float = 0) -> int:
        """How many messages a consumer with ``free`` prefetch slots (``free >= 0``) should
        take now, within ``free``: what the idle threads can start (``finishing``: as if
        that many of the messages held had finished), plus, with ``depth``, up to that
        many per thread queued behind them (while every thread of the fleet is busy)."""
        return min(free, max(0, math.ceil(self.threads * (1 + depth)) - self.busy() + finishing))

    def takes_time(self, handed_at: Mapping[str, float]) -> bool:
        """Whether jobs take time: recent ones held a thread :data:`SPREAD_JOBS_FROM` or
        longer on average (:attr:`long_jobs`), or the oldest of ``handed_at`` (a consumer's
        messages in flight: id -> when handed over, monotonic s, oldest first) has been
        running that long. Then transfers place what they move across the fleet, and
        acks list every thread freed."""
        if self.long_jobs:
            return True
        try:
            oldest = next(iter(handed_at.values()), None)
        except RuntimeError:  # a worker thread finished one meanwhile
            return False
        return oldest is not None and time.monotonic() - oldest >= SPREAD_JOBS_FROM

    def freed(self, held_for: float | None = None) -> None:
        """A message finished (after holding a thread ``held_for`` s): every consumer may
        start another."""
        if held_for is not None:
            self.job_seconds += JOB_TIME_WEIGHT * (held_for - self.job_seconds)
        for holder in self._holders:
            holder.thread_freed()

    @property
    def long_jobs(self) -> bool:
        """Whether jobs take long enough that a round trip or a write more per job does not
        count (:data:`SPREAD_JOBS_FROM`): then a transfer places what it moves by idle
        threads across the fleet, and every freed thread is listed."""
        return self.job_seconds >= SPREAD_JOBS_FROM


class WorkerRegistry:
    """This broker's Workers, by their work queue (see the module)."""

    def __init__(self) -> None:
        self._by_queue: dict[int, tuple[Any, WorkerThreads]] = {}
        self._lock = threading.Lock()

    def booted(self, worker: Any) -> None:
        """A Worker starts (``before_worker_boot``)."""
        work_queue = getattr(worker, "work_queue", None)
        threads = getattr(worker, "worker_threads", None)
        if work_queue is None or not isinstance(threads, int) or threads < 1:
            return
        with self._lock:
            self._by_queue[id(work_queue)] = (work_queue, WorkerThreads(threads))

    def stopped(self, worker: Any) -> None:
        """A Worker stopped (``after_worker_shutdown``)."""
        with self._lock:
            self._by_queue.pop(id(getattr(worker, "work_queue", None)), None)

    def of_current_thread(self) -> WorkerThreads | None:
        """The threads of the Worker whose consumer thread is running this (Dramatiq builds
        a queue's consumer in that thread), or ``None``."""
        work_queue = getattr(threading.current_thread(), "work_queue", None)
        if work_queue is None:
            return None
        with self._lock:
            found = self._by_queue.get(id(work_queue))
        return found[1] if found is not None and found[0] is work_queue else None
