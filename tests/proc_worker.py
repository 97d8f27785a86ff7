"""A worker process for the multi-process tests: ``python -m tests.proc_worker``.

Environment: REDIS_URL (records, and the broker unless CLUSTER_URL names a Redis
Cluster node to run the broker on); LIVENESS_TIMEOUT the broker's liveness_timeout; SHARDS
its shards ("queue=count,…"); WAIT_FOR_REPLICAS its wait_for_replicas; SAFETY_INTERVAL
its safety_interval (ms);
CLOCK_SHIFT_S shifts this process's wall clock (time.time and time.time_ns) to simulate
a skewed host; THREADS; QUEUE; HOLD_S makes each message
record a "start" at once and its run only after that many seconds; BUSY spends those
seconds busy instead of asleep: ``python`` in a pure-Python loop (the interpreter hands
the GIL to other threads every few ms), ``c`` in one C call that holds the GIL throughout
(``sum(range(n))``, sized to take HOLD_S). It runs until the key ``test:stop`` exists,
then exits 0. PERIODIC_EVERY_S declares a periodic actor (schedule "every-second", that
many seconds apart) that records each tick it runs (``tick``: the tick's time).
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

from dramatiq_redisson import RedissonBroker  # noqa: E402
from tests.helpers import record, serve_until_stopped  # noqa: E402

cluster_url = os.environ.get("CLUSTER_URL")
options: dict[str, object] = (
    {"liveness_timeout": int(os.environ["LIVENESS_TIMEOUT"])} if "LIVENESS_TIMEOUT" in os.environ else {}
)
if "WAIT_FOR_REPLICAS" in os.environ:
    options["wait_for_replicas"] = int(os.environ["WAIT_FOR_REPLICAS"])
if "SAFETY_INTERVAL" in os.environ:
    options["safety_interval"] = int(os.environ["SAFETY_INTERVAL"])
if os.environ.get("SHARDS"):  # "queue=count,…": sharded queues (issue 36)
    options["shards"] = {q: int(n) for q, _, n in (p.partition("=") for p in os.environ["SHARDS"].split(","))}
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
        busy = os.environ.get("BUSY")
        if busy == "python":
            until = time.monotonic() + hold
            while time.monotonic() < until:
                pass
        elif busy == "c":
            sum(range(int(hold * _sums_per_s())))
        else:
            time.sleep(hold)
    record(client, i=i)


if "PERIODIC_EVERY_S" in os.environ:
    from dramatiq.middleware import CurrentMessage

    from dramatiq_redisson import periodic

    broker.add_middleware(CurrentMessage())

    @periodic(every=f"{os.environ['PERIODIC_EVERY_S']}s", name="every-second")
    @dramatiq.actor(queue_name=os.environ.get("QUEUE", "default"), max_retries=0)
    def tick() -> None:
        message = CurrentMessage.get_current_message()
        assert message is not None
        record(client, tick=message.message_timestamp, message_id=message.message_id)


def _sums_per_s() -> float:
    """How many integers ``sum(range(n))`` adds per second here."""
    began = time.perf_counter()
    sum(range(2_000_000))
    return 2_000_000 / (time.perf_counter() - began)


def main() -> None:
    serve_until_stopped(broker, client)


if __name__ == "__main__":
    main()
