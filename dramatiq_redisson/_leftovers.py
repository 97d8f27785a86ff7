"""What a queue's consumer picks up that others left, in its upkeep (off the due path, see
``_upkeep.Upkeep``): Dramatiq's built-in ``RedisBroker`` delayed
messages (its ``<queue>.DQ`` list), moved into the delayed queue at their original eta so
that a deployment that switches brokers keeps them (:func:`migrate_batch`); the unacked
messages of dead workers, and old dead letters (:func:`maintain`)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Protocol, cast

from dramatiq.message import Message

from ._keys import acks_pattern
from ._message import encode_scheduled, prepare_scheduled

if TYPE_CHECKING:
    from ._keys import QueueKeys
    from ._settings import BrokerSettings
    from .connection._commands import Commands
    from .scripts._calls import Scripts

#: Legacy ``.DQ`` entries migrated per batch.
MIGRATION_BATCH_SIZE = 100

#: Most dead letters expired per maintenance run.
EXPIRE_LIMIT = 1000


class MaintenanceHost(Protocol):
    """What :func:`maintain` reads of the broker."""

    client: Commands
    namespace: str

    @property
    def settings(self) -> BrokerSettings: ...


def migrate_batch(client: Commands, scripts: Scripts, keys: QueueKeys, logger: logging.Logger) -> tuple[bool, int]:
    """Move one batch of ``.DQ`` messages into the delayed queue; an entry without a
    message, or one that does not decode, goes to the dead letters. Returns whether more
    may remain, and how many moved."""
    ids = [i.decode() for i in cast("list[bytes]", client.lrange(keys.legacy_dq, 0, MIGRATION_BATCH_SIZE - 1))]
    if not ids:
        return False, 0
    datas = cast("list[bytes | None]", client.hmget(keys.legacy_dq_msgs, ids))
    entries: list[tuple[int, str, str, bytes, str]] = []
    undecodable: list[str] = []
    for legacy_id, data in zip(ids, datas, strict=True):
        if data is None:
            undecodable.append(legacy_id)  # an id without a message: bury drops it
            continue
        try:
            legacy = Message.decode(data)
        except Exception:
            logger.exception("Could not decode legacy delayed message %r; moving it to the dead letters.", legacy_id)
            undecodable.append(legacy_id)
            continue
        eta = legacy.options.get("eta")
        due_ms = int(eta) if isinstance(eta, (int, float)) else 0
        message, sort_key = prepare_scheduled(legacy)
        entries.append((due_ms, sort_key, message.message_id, encode_scheduled(message, sort_key), legacy_id))
    if undecodable:
        scripts.bury_legacy(keys, undecodable)
    migrated = 0
    if entries:
        dues = scripts.offer(keys, entries, absolute=True)
        migrated = sum(1 for due in dues if due >= 0)
        logger.info("Migrated %d delayed messages from %r to the delayed queue.", migrated, keys.legacy_dq)
    return len(ids) == MIGRATION_BATCH_SIZE, migrated


def maintain(
    broker: MaintenanceHost,
    scripts: Scripts,
    keys: QueueKeys,
    worker_id: str,
    cutoff_ms: int,
    checked: set[str],
    logger: logging.Logger,
) -> bool:
    """Requeue the unacked messages of workers whose heartbeat is older than ``cutoff_ms``
    (server epoch ms; this worker aside) and expire old dead letters; drop a dead worker's
    heartbeat once no ack set of it is left (``checked``: workers whose ack sets were looked
    for already). Returns whether messages were requeued."""
    client = broker.client
    oldest = cast("list[bytes]", client.zrangebyscore(keys.heartbeats, "-inf", cutoff_ms, start=0, num=100))
    dead = [w for w in (w.decode() for w in oldest) if w != worker_id]
    requeued, expired = scripts.maintenance(
        keys, dead, dead_message_ttl_ms=broker.settings.dead_message_ttl, expire_limit=EXPIRE_LIMIT
    )
    if requeued:
        logger.warning("Requeued %d unacked messages of dead workers on queue %r.", requeued, keys.queue_name)
    if expired:
        logger.debug("Expired %d dead letters of queue %r.", expired, keys.queue_name)
    if dead and not keys.reaches_namespace:
        # Heartbeats are per queue there, and this queue's acks of those workers were just
        # recovered.
        client.zrem(keys.heartbeats, *dead)
        return bool(requeued)
    for dead_id in dead:
        if dead_id in checked:
            continue
        checked.add(dead_id)
        if next(iter(client.scan_iter(match=acks_pattern(broker.namespace, dead_id), count=1000)), None) is None:
            client.zrem(keys.heartbeats, dead_id)
    return bool(requeued)
