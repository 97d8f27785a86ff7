"""The other job queues of the ``field`` scenario (issue 55), as their worker processes
import them: the Celery app (``celery_app``), the huey instance (``huey_app``) and the rq
job function (``rq_record``), all on the server under test, whose URL the worker finds
in ``BENCH_FIELD_URL``. Every job records its start as the harness's recorder does (the
server's ``TIME``, ``RPUSH`` of ``seq sec usec pid``), but on a second server
(``BENCH_FIELD_RECORD_URL``), so that the records cost the server under test nothing.

Each library is imported only when its part is asked for (``celery_app`` and
``huey_app`` are made on first access, PEP 562): this module imports without any of them,
and a worker process of one peer never imports the others."""

from __future__ import annotations

import os
from typing import Any

import redis

from ._actor import RECORD_LUA
from ._base import QUEUE
from ._measure import REC_KEY

URL_ENV = "BENCH_FIELD_URL"
RECORD_URL_ENV = "BENCH_FIELD_RECORD_URL"
#: On the record server: one pid per worker process (or thread) that has started.
READY_KEY = "bench:field:ready"
#: The task's name in Celery and in huey.
TASK_NAME = "bench_record"

_recorder: tuple[int, redis.Redis] | None = None
_apps: dict[str, Any] = {}


def _record_client() -> redis.Redis:
    """This process's client of the record server (a forked rq work horse makes its own)."""
    global _recorder
    if _recorder is None or _recorder[0] != os.getpid():
        _recorder = (os.getpid(), redis.Redis.from_url(os.environ[RECORD_URL_ENV]))
    return _recorder[1]


def record(seq: int) -> None:
    """The job of every peer: record this start (server TIME of the record server)."""
    _record_client().eval(RECORD_LUA, 1, REC_KEY, seq, os.getpid())


def rq_record(seq: int) -> None:
    """rq's job (rq imports a job's function by its dotted name in the work horse)."""
    record(seq)


def mark_ready(*_args: Any, **_kwargs: Any) -> None:
    """A worker process (Celery) or a worker thread (huey) has started."""
    _record_client().rpush(READY_KEY, os.getpid())


def make_celery(url: str) -> tuple[Any, Any]:
    """A Celery app on the Redis broker at ``url`` and its recording task: the bench queue,
    no result backend (the job returns nothing, as the Dramatiq actor), everything else
    Celery's defaults (acks on receipt, prefetch multiplier 4, heartbeats, gossip and
    mingle on). A worker reports itself ready on the ``worker_ready`` signal."""
    from celery import Celery
    from celery.signals import worker_ready

    app = Celery("bench_field", broker=url, set_as_current=False)
    app.conf.update(
        task_default_queue=QUEUE,
        task_ignore_result=True,
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
    )
    task = app.task(name=TASK_NAME, ignore_result=True)(record)
    worker_ready.connect(mark_ready, weak=False)
    return app, task


def make_huey(url: str) -> tuple[Any, Any]:
    """A ``RedisHuey`` at ``url`` (blocking dequeue, its default) without results (the job
    returns nothing) and its recording task; every worker thread reports itself ready
    from an ``on_startup`` hook."""
    from huey import RedisHuey

    huey = RedisHuey("bench", url=url, results=False)
    task = huey.task(name=TASK_NAME)(record)
    huey.on_startup()(mark_ready)
    return huey, task


def __getattr__(name: str) -> Any:
    """``celery_app`` and ``huey_app`` for ``celery -A`` and ``huey_consumer``."""
    makers = {"celery_app": make_celery, "huey_app": make_huey}
    if name not in makers:
        raise AttributeError(name)
    if name not in _apps:
        _apps[name] = makers[name](os.environ[URL_ENV])[0]
    return _apps[name]
