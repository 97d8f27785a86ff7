"""The broker and the actor of the example app.

Importable by the ``dramatiq`` command line::

    REDIS_URL=redis://127.0.0.1:6379/0 dramatiq example_app.tasks:broker

The broker is built from ``$REDIS_URL`` (default ``redis://127.0.0.1:6379/0``) and
made the global broker *before* the actor is declared, so the actor binds to it.
"""

from __future__ import annotations

import os

import dramatiq
from dramatiq.logging import get_logger

from dramatiq_redisson import RedissonBroker

from .orders import OrderStore

#: Used when ``$REDIS_URL`` is not set.
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"

#: The queue of the cancel-if-unpaid timers.
QUEUE_NAME = "order_timeouts"

logger = get_logger(__name__)

broker = RedissonBroker(url=os.environ.get("REDIS_URL") or DEFAULT_REDIS_URL)
dramatiq.set_broker(broker)


@dramatiq.actor(queue_name=QUEUE_NAME, max_retries=3)
def cancel_if_unpaid(run_id: str, order: int) -> None:
    """Cancel an order whose payment timer ran out, unless it got paid meanwhile.

    Sent with ``delay=`` when the order is placed; the shop removes the message from
    the delayed queue when the order is paid. The status check makes the actor
    correct even when that removal loses a race with the timer.
    """
    store = OrderStore(broker.client, run_id)
    if store.cancel_if_unpaid(order):
        logger.info("Order %d of run %s cancelled: not paid in time.", order, run_id)
    else:
        logger.info("Order %d of run %s is %s; nothing to cancel.", order, run_id, store.status(order))
