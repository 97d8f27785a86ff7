"""``redisson-lrem``: RedissonBroker with its transfer replaced by Redisson's original logic
(``redisson_original_transfer.lua``: ZRANGEBYSCORE LIMIT 100, per entry RPUSH + LREM of the
backup list, ZREM). Everything else (offer, fetch, ack, the timer) is RedissonBroker's, so
the difference measured is the transfer alone."""

from __future__ import annotations

from typing import Any

from dramatiq.broker import Consumer

from dramatiq_redisson import RedissonBroker

from ._internals import RedissonConsumer, TransferDuty, TransferResult, queue_json, reference_lua

#: Redisson's batch size.
REDISSON_BATCH = 100


class LremTransferDuty(TransferDuty):
    def transfer(self) -> None:
        broker: Any = self.host  # an LremRedissonBroker
        for _ in range(20):
            k = self.keys
            moved, next_due, now_ms, _ = broker.reference_transfer(
                keys=[k.ready, k.timeout_zset, k.backup_list, k.payloads, k.ready_msgs],
                args=[REDISSON_BATCH, queue_json(k.queue_name)],
            )
            next_due_ms = None if int(next_due) < 0 else int(next_due)
            self.timer.record(TransferResult(int(moved), next_due_ms, int(now_ms) * 1000, 0))
            if int(moved) < REDISSON_BATCH:
                break
        else:
            self.timer.force()


class LremConsumer(RedissonConsumer):
    transfer_duty_class = LremTransferDuty


class LremRedissonBroker(RedissonBroker):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.reference_transfer = self.client.register_script(reference_lua())

    @property
    def consumer_class(self) -> type[Consumer]:
        return LremConsumer
