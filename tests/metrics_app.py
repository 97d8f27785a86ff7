"""A broker module for the metrics tests: ``dramatiq tests.metrics_app:broker -Q default``.

Environment: REDIS_URL. The broker has this package's Prometheus middleware; the actors
record their runs (``stamp``), fail for good (``fail``, to make a dead letter), or live on
the ``idle`` queue, which the test's workers do not consume (its messages go overdue).
"""

from __future__ import annotations

import os

import dramatiq
import redis

from dramatiq_redisson import RedissonBroker
from dramatiq_redisson.metrics import Prometheus
from tests.helpers import record

broker = RedissonBroker(url=os.environ["REDIS_URL"])
broker.add_middleware(Prometheus())
dramatiq.set_broker(broker)
client = redis.Redis.from_url(os.environ["REDIS_URL"])


@dramatiq.actor(max_retries=0)
def stamp(i: int) -> None:
    record(client, i=i)


@dramatiq.actor(max_retries=0)
def fail() -> None:
    raise RuntimeError("dead letter on purpose")


@dramatiq.actor(queue_name="idle", max_retries=0)
def idle() -> None:
    pass
