"""What a consumer checks before its first subscription, once per broker and queue.

:class:`StartGate` is built by the broker and given to its consumers: before a consumer
subscribes (the first tick, before the first fetch), the gate refuses a server the broker
cannot run on (once per broker, again while the server cannot be asked:
:class:`._errors.UnsupportedServer` stops that consumer), and names everything the Redis
user may not do on the queue, in one error, instead of failing call by call (once per
queue and broker; again while the server cannot be asked). Neither runs in a consumer's
``__init__``, which Dramatiq's consumer thread runs before it publishes the consumer: it
stays free of network calls, as the built-in consumer's.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Protocol, cast

import redis

from ._errors import MissingPermission
from ._logs import CONNECTION_ERRORS
from .connection._permissions import check_permissions

if TYPE_CHECKING:
    from ._keys import QueueKeys
    from ._settings import BrokerSettings
    from .connection._commands import Commands


class GateHost(Protocol):
    """What the start gate reads of its broker. Nothing else (``tests/test_shape.py``
    checks it)."""

    client: Commands

    @property
    def settings(self) -> BrokerSettings: ...

    @property
    def server_version(self) -> tuple[int, int, int] | None: ...

    def check_server_if_reachable(self) -> None: ...


class StartGate:
    """The server check and the permission probe of one broker's consumers (see the module).

    Parameters:
      broker: Its broker: the server check (a server that cannot be asked now passes),
        the server's version once checked and whether it waits for replicas (the probe's
        commands depend on both), and the client the probe's commands go through.
    """

    def __init__(self, broker: GateHost) -> None:
        self.broker = broker
        #: Queues whose consumers ran the permission probe.
        self.checked: set[str] = set()

    def check(self, keys: QueueKeys, worker_id: str, logger: logging.Logger) -> None:
        """Check the server, then (once per queue) the Redis user's permissions on the
        queue of ``keys``: a missing one is logged as an error (the consumer goes on, and
        the calls that need it fail on their own)."""
        broker = self.broker
        broker.check_server_if_reachable()
        if keys.queue_name in self.checked:
            return
        try:
            check_permissions(
                cast("Any", broker.client),
                keys,
                worker_id=worker_id,
                wait_for_replicas=bool(broker.settings.wait_for_replicas),
                server_version=broker.server_version,
            )
        except MissingPermission as e:
            logger.error("%s", e)
        except (*CONNECTION_ERRORS, redis.ResponseError):
            return  # unknown yet: checked again at the next subscription
        self.checked.add(keys.queue_name)
