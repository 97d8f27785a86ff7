"""A worker process for the multi-process tests: ``python -m tests.proc_worker``.

Environment: REDIS_URL (records, and the broker unless CLUSTER_URL names a Redis
Cluster node to run the broker on); LIVENESS_TIMEOUT the broker's liveness_timeout;
CLOCK_SHIFT_S shifts this process's wall clock (time.time and time.time_ns) to simulate
a skewed host; THREADS; QUEUE; HOLD_S makes each message
record a "start" at once and its run only after that many seconds. It runs until the key
``test:stop`` exists, then exits 0.
"""

from __future__ import annotations

import os
import time

shift = float(os.environ.get("CLOCK_SHIFT_S", "0"))
if shift:
    _time, _time_ns = time.time, time.time_ns
    time.time = lambda: _time() + shift  # type: ignore[assignment]
    time.time_ns = lambda: _time_ns() + int(shift * 1e9)  # type: ignore[assignment]

import dramatiq  # noqa: E402
import redis  # noqa: E402
from dramatiq import Worker  # noqa: E402

from dramatiq_redisson import RedissonBroker  # noqa: E402
from tests.helpers import record  # noqa: E402

cluster_url = os.environ.get("CLUSTER_URL")
options = {"liveness_timeout": int(os.environ["LIVENESS_TIMEOUT"])} if "LIVENESS_TIMEOUT" in os.environ else {}
broker = (
    RedissonBroker(url=cluster_url, cluster=True, **options)
    if cluster_url
    else RedissonBroker(url=os.environ["REDIS_URL"], **options)
)
dramatiq.set_broker(broker)
client = redis.Redis.from_url(os.environ["REDIS_URL"])


@dramatiq.actor(queue_name=os.environ.get("QUEUE", "default"), max_retries=0)
def stamp(i: int) -> None:
    hold = float(os.environ.get("HOLD_S", "0"))
    if hold:
        record(client, i=i, started=True)
        time.sleep(hold)
    record(client, i=i)


def main() -> None:
    worker = Worker(broker, worker_threads=int(os.environ.get("THREADS", "4")), worker_timeout=100)
    worker.start()
    client.incr("test:workers-ready")
    try:
        while not client.exists("test:stop"):
            time.sleep(0.05)
    finally:
        worker.stop()


if __name__ == "__main__":
    main()
