"""The migration of Dramatiq's built-in ``RedisBroker`` delayed messages (its ``<queue>.DQ``
list) into the delayed queue, at their original eta: a deployment that switches brokers
keeps the messages the built-in one had scheduled. Run by each queue's consumer in its
upkeep (see :meth:`._consumer.RedissonConsumer.upkeep`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from dramatiq.message import Message

from ._message import encode_scheduled, prepare_scheduled

if TYPE_CHECKING:
    from ._keys import QueueKeys
    from ._scripts import Scripts

#: Legacy ``.DQ`` entries migrated per batch.
MIGRATION_BATCH_SIZE = 100


def migrate_batch(client: Any, scripts: Scripts, keys: QueueKeys, logger: Any) -> tuple[bool, int]:
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
