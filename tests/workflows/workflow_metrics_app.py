"""A broker module for the workflow metrics test:
``dramatiq tests.workflows.workflow_metrics_app:broker -Q default``.

Environment: REDIS_URL. The broker has this package's Prometheus middleware; ``add`` sums
its arguments (a step that succeeds), ``boom`` raises (a step that fails for good).
"""

from __future__ import annotations

import os
from typing import Any

import dramatiq

from dramatiq_redisson import RedissonBroker
from dramatiq_redisson.metrics import Prometheus

broker = RedissonBroker(url=os.environ["REDIS_URL"])
broker.add_middleware(Prometheus())
dramatiq.set_broker(broker)


@dramatiq.actor(max_retries=0)
def add(*args: Any) -> int:
    return sum(arg for arg in args if isinstance(arg, int))


@dramatiq.actor(max_retries=0)
def boom(*args: Any) -> None:
    raise RuntimeError("a step that fails on purpose")
