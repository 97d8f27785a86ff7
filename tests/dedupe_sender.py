"""A producer process for the dedupe race test: ``python -m tests.dedupe_sender``.

Environment: REDIS_URL; MODE ("keep" or "replace"); SENDS (how many sends); KEY (the
dedupe key); DELAY (ms). It waits until the key ``test:go`` exists (so that every
process starts at once), sends SENDS messages with that dedupe key, and pushes to
``test:sent`` one JSON record per send: the sent message's id, the returned message's
id and ``eta``, and whether it was this process's last send.
"""

from __future__ import annotations

import json
import os
import time

import dramatiq
import redis

from dramatiq_redisson import RedissonBroker

broker = RedissonBroker(url=os.environ["REDIS_URL"])
dramatiq.set_broker(broker)
client = redis.Redis.from_url(os.environ["REDIS_URL"])


@dramatiq.actor(max_retries=0)
def keyed(pid: int, i: int) -> None: ...


def main() -> None:
    mode, sends, key, delay = os.environ["MODE"], int(os.environ["SENDS"]), os.environ["KEY"], int(os.environ["DELAY"])
    client.incr("test:senders-ready")
    while not client.exists("test:go"):
        time.sleep(0.001)
    for i in range(sends):
        message = keyed.message_with_options(args=(os.getpid(), i), dedupe_key=key, dedupe=mode)
        returned = broker.enqueue(message, delay=delay)
        record = {
            "sent": message.message_id,
            "returned": returned.message_id,
            "eta": returned.options.get("eta"),
            "last": i == sends - 1,
        }
        client.rpush("test:sent", json.dumps(record))
    broker.close()


if __name__ == "__main__":
    main()
