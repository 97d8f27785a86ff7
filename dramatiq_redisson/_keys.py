"""Every Redis key and channel name the broker uses, in one place.

For a queue ``Q`` in namespace ``ns`` the queue key is ``N = "ns:Q"``.

Ready-queue layout, shared with :class:`dramatiq.brokers.redis.RedisBroker`:

=====================================  ======  ==========================================
``ns:Q``                               LIST    redis message ids ready to run
``ns:Q.msgs``                          HASH    redis message id -> encoded message
``ns:__acks__.<worker id>.Q``          SET     fetched by a worker, not yet acked
``ns:__heartbeats__``                  ZSET    worker id -> last seen (epoch ms)
``ns:__queues__``                      SET     queues that have had consumers (for the
                                               operators' tools; not in the built-in layout)
``ns:Q.XQ`` / ``ns:Q.XQ.msgs``         ZSET    dead letters (scored by time of death) / data
``ns:Q.DQ`` / ``ns:Q.DQ.msgs``         LIST    the built-in broker's delay queue (migrated)
=====================================  ======  ==========================================

Redisson delayed-queue layout (the ``{N}`` hash tag keeps them in one cluster slot):

=========================================  =======  =====================================
``redisson_delay_queue_timeout:{N}``       ZSET     member -> due time (epoch ms)
``redisson_delay_queue:{N}``               LIST     members in offer order (backup list)
``redisson_delay_queue_channel:{N}``       channel  due time (decimal ms) of a new head; "0": ready
``redisson_delay_queue_msgs:{N}``          HASH     message id -> sort key + encoded message
``redisson_delay_queue_compact:{N}``       LIST     backup list being rebuilt (compaction)
``redisson_delay_queue_cursor:{N}``        STRING   read position of a compaction pass
``redisson_delay_queue_sent:{N}``          ZSET     redis message id -> enqueue time (epoch
                                                    ms) of recent immediate sends (dedupe)
``redisson_delay_queue_lease:{N}``         STRING   "<consumer token> <expiry, epoch ms>":
                                                    the consumer that runs transfers (PX)
``redisson_delay_queue_consumers:{N}``     ZSET     consumer token -> last seen (epoch ms)
``redisson_delay_queue_idle:{N}``          ZSET     consumer token -> free slots, for each
                                                    consumer whose last fetch came up short
``redisson_delay_queue_channel:{N}``       channel  one consumer's wake-ups: "0" messages
``:wake:{<consumer token>}``                        are ready, "-1" take the transfer lease
=========================================  =======  =====================================

Fleet cost (see :mod:`dramatiq_redisson._consumer`): one consumer per queue holds the
transfer lease and alone runs the timer; the others check the lease when it would lapse.
A ready message wakes only as many idle consumers as it needs, through their own wake
channels. A wake channel keeps the queue's ``{N}`` hash tag first (same cluster slot)
and ends in ``}``, so the channel pattern of earlier ACL rules
(``redisson_delay_queue_channel:{ns:*}``) covers it.

A member is a 16-character sort key (offer time and a per-process counter, so that
equal due times keep offer order) followed by the message id. It doubles as the
``redis_message_id`` of the message once it moves to the ready queue.
"""

from __future__ import annotations

from dataclasses import dataclass


def heartbeats_key(namespace: str) -> str:
    """Worker id -> last heartbeat (epoch ms) of every worker of ``namespace``."""
    return f"{namespace}:__heartbeats__"


def registry_key(namespace: str) -> str:
    """The set of queue names of ``namespace`` that have had consumers."""
    return f"{namespace}:__queues__"


@dataclass(frozen=True)
class QueueKeys:
    """The names of every key that belongs to one queue."""

    namespace: str
    queue_name: str

    @property
    def name(self) -> str:
        return f"{self.namespace}:{self.queue_name}"

    # Ready queue (built-in layout).
    @property
    def ready(self) -> str:
        return self.name

    @property
    def ready_msgs(self) -> str:
        return f"{self.name}.msgs"

    @property
    def xq(self) -> str:
        return f"{self.name}.XQ"

    @property
    def xq_msgs(self) -> str:
        return f"{self.name}.XQ.msgs"

    @property
    def legacy_dq(self) -> str:
        return f"{self.name}.DQ"

    @property
    def legacy_dq_msgs(self) -> str:
        return f"{self.name}.DQ.msgs"

    def acks(self, worker_id: str) -> str:
        return f"{self.namespace}:__acks__.{worker_id}.{self.queue_name}"

    def legacy_dq_acks(self, worker_id: str) -> str:
        return f"{self.namespace}:__acks__.{worker_id}.{self.queue_name}.DQ"

    @property
    def heartbeats(self) -> str:
        return heartbeats_key(self.namespace)

    @property
    def registry(self) -> str:
        """The names of the namespace's queues that have had consumers (written by each
        consumer's heartbeat; read by :meth:`RedissonBroker.stats` and the CLI)."""
        return registry_key(self.namespace)

    # Redisson delayed queue.
    @property
    def timeout_zset(self) -> str:
        return f"redisson_delay_queue_timeout:{{{self.name}}}"

    @property
    def backup_list(self) -> str:
        return f"redisson_delay_queue:{{{self.name}}}"

    @property
    def channel(self) -> str:
        return f"redisson_delay_queue_channel:{{{self.name}}}"

    @property
    def payloads(self) -> str:
        return f"redisson_delay_queue_msgs:{{{self.name}}}"

    @property
    def compact_list(self) -> str:
        return f"redisson_delay_queue_compact:{{{self.name}}}"

    @property
    def compact_cursor(self) -> str:
        return f"redisson_delay_queue_cursor:{{{self.name}}}"

    @property
    def sent(self) -> str:
        """Redis message ids enqueued to the ready queue within the dedupe window."""
        return f"redisson_delay_queue_sent:{{{self.name}}}"

    @property
    def lease(self) -> str:
        """Who runs this queue's transfers (a short lease, renewed by every transfer)."""
        return f"redisson_delay_queue_lease:{{{self.name}}}"

    @property
    def consumers(self) -> str:
        """Consumers of this queue, by token, scored by when they last ran a transfer."""
        return f"redisson_delay_queue_consumers:{{{self.name}}}"

    @property
    def idle(self) -> str:
        """Consumers waiting for ready messages, by token, scored by their free slots."""
        return f"redisson_delay_queue_idle:{{{self.name}}}"

    def wake_channel(self, token: str) -> str:
        """The channel on which one consumer (``token``) is woken; the scripts build it
        from :attr:`channel` the same way."""
        return f"{self.channel}:wake:{{{token}}}"

    @property
    def scheduled_keys(self) -> tuple[str, str, str, str, str]:
        """The keys that hold scheduled messages, in the order clear.lua takes them."""
        return (self.timeout_zset, self.backup_list, self.payloads, self.compact_list, self.compact_cursor)
