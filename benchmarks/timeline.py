"""Redisson's timeline scenario, measured: ``python -m benchmarks.timeline [--runs N]``.

Offers "1"@1 s, "2"@5 s, "4"@4 s, "2"@2 s, "3"@3 s to one queue with a running worker and
prints, per run, the delivery order and each message's lateness (start on the server
clock minus due time on the server clock). Uses $REDIS_URL or an embedded Valkey.
"""

from __future__ import annotations

import argparse
import json
import statistics

import dramatiq
import redis
from dramatiq import Worker

from dramatiq_redisson import RedissonBroker
from dramatiq_redisson.embedded import redis_url

OFFERS = [("1", 1), ("2", 5), ("4", 4), ("2", 2), ("3", 3)]


def server_ms(client: redis.Redis) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def run_once(url: str) -> tuple[list[str], list[int]]:
    client = redis.Redis.from_url(url)
    client.flushdb()
    broker = RedissonBroker(url=url)
    dramatiq.set_broker(broker)
    started: list[tuple[str, int]] = []

    @dramatiq.actor(queue_name="timeline")
    def deliver(value: str) -> None:
        started.append((value, server_ms(client)))

    worker = Worker(broker, worker_threads=2, worker_timeout=100)
    worker.start()
    try:
        dues = []
        for value, seconds in OFFERS:
            message = deliver.send_with_options(args=(value,), delay=seconds * 1000)
            score = client.zscore(
                "redisson_delay_queue_timeout:{dramatiq:timeline}", message.options["redis_message_id"]
            )
            dues.append(int(score or 0))
        broker.join("timeline", timeout=15_000)
        worker.join()
    finally:
        worker.stop()
        broker.close()
        client.close()
    lateness = [at - due for (_, at), due in zip(started, sorted(dues), strict=True)]
    return [value for value, _ in started], lateness


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    all_lateness: list[int] = []
    with redis_url() as url:
        for i in range(args.runs):
            order, lateness = run_once(url)
            all_lateness.extend(lateness)
            print(json.dumps({"run": i + 1, "order": order, "lateness_ms": lateness}))
    print(
        json.dumps(
            {
                "runs": args.runs,
                "expected_order": ["1", "2", "3", "4", "2"],
                "lateness_ms": {
                    "min": min(all_lateness),
                    "median": statistics.median(all_lateness),
                    "max": max(all_lateness),
                },
            }
        )
    )


if __name__ == "__main__":
    main()
