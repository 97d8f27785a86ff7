"""The app of the deploy test in ``tests/test_progress.py``, run by the ``dramatiq`` command:
``python -m dramatiq tests.progress_app:broker -p 1 -t 1 -Q long``.

Environment: REDIS_URL. ``long_job(steps, step_ms)`` runs ``steps`` steps of ``step_ms``
each, resuming from its checkpoint, and records (``tests.helpers.record``: server time,
pid) each step done with the run's ``retries`` option, when it saw ``should_stop()``, and
its end.
"""

from __future__ import annotations

import os
import time

import dramatiq
import redis
from dramatiq.middleware import CurrentMessage, default_middleware

from dramatiq_redisson import RedissonBroker, progress
from tests.helpers import record

broker = RedissonBroker(url=os.environ["REDIS_URL"], middleware=[m() for m in default_middleware])
broker.add_middleware(CurrentMessage())
dramatiq.set_broker(broker)
client = redis.Redis.from_url(os.environ["REDIS_URL"])


@dramatiq.actor(queue_name="long", max_retries=0)
def long_job(steps: int, step_ms: int) -> None:
    message = CurrentMessage.get_current_message()
    retries = message.options.get("retries", 0) if message is not None else None
    state = progress.resume() or {"step": 0}
    record(client, event="resumed", step=state["step"], retries=retries)
    while state["step"] < steps:
        time.sleep(step_ms / 1000)  # the step's work
        record(client, event="step", step=state["step"], retries=retries)
        state["step"] += 1
        progress.checkpoint(state)
        progress.report(state["step"] / steps, f"step {state['step']} of {steps}")
        if progress.should_stop():
            record(client, event="stopping", step=state["step"])
            raise progress.Interrupted()
    record(client, event="done", step=state["step"])
