"""A worker process for tests/periodic/test_periodic_policies.py: ``python -m tests.periodic_policy_worker``.

Environment: REDIS_URL (the broker and the records); SCHEDULES, a JSON list of schedules,
each the keyword arguments of ``@periodic`` (``start``/``end`` as ISO 8601 texts with an
offset) plus ``hold_s``, how long each run takes. Every schedule runs the actor
``policy_tick``, which records each run: the schedule's name, the tick's time and message
id, when the run started and ended (server clock) and the process id. THREADS sets the
worker threads. It runs until the key ``test:stop`` exists, then exits 0.
"""

from __future__ import annotations

import json
import logging
import os
import time
from datetime import datetime
from typing import Any

import dramatiq
import redis
from dramatiq.middleware import CurrentMessage

from dramatiq_redisson import RedissonBroker, periodic
from tests.helpers import record, serve_until_stopped, server_ms

logging.basicConfig(level=logging.INFO, format="%(process)d %(name)s %(levelname)s %(message)s")

broker = RedissonBroker(url=os.environ["REDIS_URL"])
broker.add_middleware(CurrentMessage())
dramatiq.set_broker(broker)
client = redis.Redis.from_url(os.environ["REDIS_URL"])


@dramatiq.actor(max_retries=0)
def policy_tick(hold_s: float) -> None:
    message = CurrentMessage.get_current_message()
    assert message is not None
    started = server_ms(client)
    time.sleep(hold_s)
    record(
        client,
        name=message.options.get("periodic"),
        tick=message.message_timestamp,
        message_id=message.message_id,
        started_ms=started,
        ended_ms=server_ms(client),
    )


def _declare(each: dict[str, Any]) -> None:
    options = dict(each)
    hold = float(options.pop("hold_s", 0))
    for field in ("start", "end"):
        if field in options:
            options[field] = datetime.fromisoformat(options[field])
    periodic(args=(hold,), **options)(policy_tick)


for schedule in json.loads(os.environ.get("SCHEDULES", "[]")):
    _declare(schedule)


def main() -> None:
    serve_until_stopped(broker, client)


if __name__ == "__main__":
    main()
