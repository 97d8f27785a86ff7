"""What keeps a consumer sound but delivers nothing now: its upkeep.

:class:`Upkeep` is a consumer's side work, run off the due path (see
``_consumer.RedissonConsumer.tick``): joining its queue's liveness beats and reconciling the
queue's periodic actors when it starts; then reconciling its worker's ack set after a lost
reply, the migration of the built-in broker's ``.DQ`` entries, the dead workers' check
while it holds the transfer lease, the heartbeat and maintenance (what others left is
``_leftovers``). Each task is on its own: a server error in one (say, a full server
refusing a ``.DQ`` migration) is logged and retried later while the others, and fetching,
go on (the consumer's :class:`._backoff.Failures`); a lost connection stops them all (the
consumer backs off).
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Protocol

from ._leftovers import maintain, migrate_batch

if TYPE_CHECKING:
    from ._backoff import Failures
    from ._held import HeldMessages
    from ._keys import QueueKeys
    from ._liveness import Liveness, Reaper
    from ._settings import BrokerSettings
    from ._timer import TransferTimer
    from .connection._commands import Commands
    from .connection._primary_watch import PrimaryWatch
    from .periodic._schedules import Schedules
    from .scripts._calls import Scripts


class UpkeepHost(Protocol):
    """What a consumer's upkeep uses of the broker. Nothing else (``tests/test_shape.py``
    checks it)."""

    client: Commands
    held: HeldMessages
    liveness: Liveness
    namespace: str
    primary_watch: PrimaryWatch
    redisson_scripts: Scripts
    schedules: Schedules

    @property
    def settings(self) -> BrokerSettings: ...


class Upkeep:
    """The upkeep of one consumer (see the module).

    Parameters:
      host: The broker (see :class:`UpkeepHost`).
      failures: The consumer's error and back-off policy (its tasks are guarded by it).
      keys: The consumer's queue.
      queue_name: Its name.
      worker_id: The consumer's worker (its ack set and heartbeat).
      timer: The consumer's transfer timer: whether it holds the lease, the server's clock.
      reaper: The queue's dead-worker check, run while it holds the lease.
      logger_name: The consumer's logger.
    """

    def __init__(
        self,
        host: UpkeepHost,
        failures: Failures,
        keys: QueueKeys,
        *,
        queue_name: str,
        worker_id: str,
        timer: TransferTimer,
        reaper: Reaper,
        logger_name: str,
    ) -> None:
        self.host = host
        self.failures = failures
        self.keys = keys
        self.queue_name = queue_name
        self.worker_id = worker_id
        self.timer = timer
        self.reaper = reaper
        self.logger = logging.getLogger(logger_name)
        #: On (re)start: ids a lost reply left in our ack set.
        self.reconcile_due = True
        self.migrate_legacy = True
        self.next_maintenance_at = time.monotonic() + random.uniform(0, host.settings.maintenance_interval / 1000)
        self.next_housekeeping_at = time.monotonic() + host.settings.safety_interval / 1000
        self.checked_dead_workers: set[str] = set()
        self.joined = False  # beating for the queue (see _liveness)
        self.schedules_reconciled = False

    def start(self) -> None:
        """At the first tick (not in the consumer's ``__init__``, which stays free of
        network calls): beat for the queue, start the primary watch, and reconcile the
        queue's periodic actors (stored, updated, resumed; again at each tick until it
        worked)."""
        if not self.joined:
            self.joined = True
            self.host.liveness.join(self.queue_name)
            self.host.primary_watch.start()
        if not self.schedules_reconciled:
            self.schedules_reconciled = (
                self.failures.guarded(self.host.schedules.reconcile, self.queue_name) is not None
            )

    def stop(self) -> None:
        """The consumer closes: stop beating for the queue (a clean stop is not a death)."""
        if self.joined:
            self.joined = False
            self.host.liveness.leave(self.queue_name)

    def attend(self, names: Iterable[str]) -> None:
        """A transfer chained the queue's periodic actors ``names``: attend them (see
        ``Schedules.attend``)."""
        self.failures.guarded(self.host.schedules.attend, self.keys, names)

    def lost_reply(self) -> None:
        """A call that may have taken messages into this worker's ack set lost its reply:
        reconcile the ack set at the next run (see :meth:`reconcile`)."""
        self.reconcile_due = True

    def soon(self, seconds: float) -> None:
        """Run the housekeeping (heartbeat, reconciliation) within ``seconds``: a call whose
        reply was lost may run on the server after the first reconciliation that follows (a
        stalled server works off its buffered commands in its own order)."""
        self.next_housekeeping_at = min(self.next_housekeeping_at, time.monotonic() + seconds)

    def run(self, now: float) -> None:
        """Reconciling, the legacy migration, the dead workers' check, the heartbeat and
        maintenance, each when due."""
        guarded = self.failures.guarded
        if self.reconcile_due and guarded(self.reconcile) is not None:
            self.reconcile_due = False
        if self.migrate_legacy:
            # Cleared first: after a lost connection (raised past this line) the next
            # attempt waits for housekeeping instead of every tick.
            self.migrate_legacy = False
            self.migrate_legacy = bool(guarded(self._migrate_legacy_batch))
        if self.timer.owner:
            guarded(self.reaper.check, now)
        if now >= self.next_housekeeping_at:
            # Keep this worker's heartbeat fresh while all its threads are busy, requeue
            # what a lost fetch reply stranded in our ack set, and pick up legacy .DQ
            # entries that built-in workers requeued meanwhile.
            self.next_housekeeping_at = now + self.host.settings.safety_interval / 1000
            guarded(self.host.redisson_scripts.heartbeat, self.keys, self.worker_id)
            self.reconcile_due = True
            self.migrate_legacy = True
        if now >= self.next_maintenance_at:
            self.next_maintenance_at = now + self.host.settings.maintenance_interval / 1000
            guarded(self._maintain)
            if self.timer.owner:
                guarded(self.host.schedules.attend_all, self.queue_name)

    def reconcile(self) -> int:
        """Requeue ids in this worker's ack set that no consumer of this process holds.

        A fetch whose reply was lost (timeout, killed connection, a retried call) left
        them there: nothing would run or ack them until this process died and its
        heartbeat timed out. Returns how many were requeued."""
        host = self.host
        with host.held.lock(self.queue_name):
            client = host.client
            in_ack_set: set[bytes] = client.smembers(self.keys.acks(self.worker_id))
            held = host.held.snapshot(self.queue_name)
            stranded = [i for i in (m.decode() for m in in_ack_set) if i not in held]
            if not stranded:
                return 0
            requeued = int(host.redisson_scripts.requeue(self.keys, self.worker_id, stranded))
        if requeued:
            self.logger.warning(
                "Requeued %d messages of queue %r left in this worker's ack set (a lost fetch reply, or a "
                "workflow step whose record failed).",
                requeued,
                self.queue_name,
            )
        return requeued

    def _migrate_legacy_batch(self) -> bool:
        """Move one batch of the built-in broker's ``.DQ`` messages into the delayed queue
        (see ``_leftovers.migrate_batch``). Returns whether more may remain."""
        more, migrated = migrate_batch(self.host.client, self.host.redisson_scripts, self.keys, self.logger)
        if migrated:
            self.timer.force()
        return more

    def _maintain(self) -> None:
        """Requeue the unacked messages of dead workers; expire old dead letters (see
        ``_leftovers.maintain``)."""
        cutoff = int(self.timer.server_now_ms() - self.host.settings.heartbeat_timeout)
        if maintain(
            self.host,
            self.host.redisson_scripts,
            self.keys,
            self.worker_id,
            cutoff,
            self.checked_dead_workers,
            self.logger,
        ):
            self.migrate_legacy = True
