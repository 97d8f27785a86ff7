"""The app of the rolling deploy in ``tests/test_unknown_actors.py``, run by the ``dramatiq``
command: ``python -m dramatiq tests.unknown_actors_app --processes 1 --threads 2``.

Environment: REDIS_URL (the broker and the records); APP_RELEASE ``old`` declares the actor
``old_job``, ``new`` declares ``roll_new`` too (the actor a deploy adds); JOB_S how long
each job sleeps (default 0.05).

Each run appends ``{"id", "actor", "release", "at_ms", "pid"}`` to ``test:record`` (the
server's clock), and each worker process, once its Worker runs, appends ``{"release",
"at_ms", "pid"}`` to ``test:booted``.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import dramatiq
import redis
from dramatiq.middleware import CurrentMessage, Middleware

from dramatiq_redisson import RedissonBroker
from tests.helpers import record, server_ms

#: Where each worker process says it runs (see the module).
BOOTED = "test:booted"

RELEASE = os.environ.get("APP_RELEASE", "old")
JOB_S = float(os.environ.get("JOB_S", "0.05"))

client = redis.Redis.from_url(os.environ["REDIS_URL"])


class Booted(Middleware):
    """Appends this process's release and the server's time to :data:`BOOTED` once its
    Worker runs."""

    def after_worker_boot(self, broker: Any, worker: Any) -> None:
        client.rpush(BOOTED, json.dumps({"release": RELEASE, "at_ms": server_ms(client), "pid": os.getpid()}))


broker = RedissonBroker(url=os.environ["REDIS_URL"])
broker.add_middleware(CurrentMessage())
broker.add_middleware(Booted())
dramatiq.set_broker(broker)


def _run(actor: str) -> None:
    message = CurrentMessage.get_current_message()
    assert message is not None
    record(client, id=message.message_id, actor=actor, release=RELEASE)
    time.sleep(JOB_S)


@dramatiq.actor(max_retries=0)
def old_job() -> None:
    _run("old_job")


if RELEASE == "new":

    @dramatiq.actor(max_retries=0)
    def roll_new() -> None:
        _run("roll_new")
