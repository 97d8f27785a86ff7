"""Where do a scheduled message's server bytes go, and what would a leaner layout save?

    python -m benchmarks.profile_memory [--n 100000] [--url URL]

Offers ``n`` messages due in 1 h through each broker and prints MEMORY USAGE per key
divided by ``n``. Then writes the same messages in alternative RedissonBroker layouts
with plain commands (no broker code changes) to price each idea:

- full: the stored message carries options.redis_message_id (the layout before cfa1900,
  and still the one for encoders other than JSON);
- installed: what the broker stores (``encode_scheduled``: with Dramatiq's JSON encoder a
  compact payload, the JSON text of each field without names, queue or ids, which
  transfer.lua writes back as the JSON message);
- installed + list-of-keys: the backup list would hold only the 16-char sort key (its
  entries are then useless for compaction, which checks them against the ZSET).
"""

from __future__ import annotations

import argparse
from typing import Any

from ._base import HOUR_MS, QUEUE, quiet_logging
from ._brokers import bulk_offer, make_broker
from ._server import Server


def _usage(server: Server, n: int) -> dict[str, float]:
    out = {}
    for key in sorted(server.r.keys("*")):
        if b"__heartbeats__" in key:
            continue
        name = key.decode() if isinstance(key, bytes) else str(key)
        out[name] = round((server.r.memory_usage(key, samples=0) or 0) / n, 1)
    out["TOTAL used_memory delta"] = 0.0
    return out


def main(argv: list[str] | None = None) -> int:
    from ._actor import declare
    from ._internals import encode_scheduled

    parser = argparse.ArgumentParser(prog="python -m benchmarks.profile_memory")
    parser.add_argument("--n", type=int, default=100_000)
    parser.add_argument("--url", default=None)
    args = parser.parse_args(argv)
    quiet_logging()
    server = Server(args.url)
    n = args.n
    try:
        for kind in ("redisson", "builtin"):
            server.flush()
            broker = make_broker(kind, server.url)
            actor = declare(broker)
            base = server.used_memory()
            bulk_offer(broker, kind, actor, list(range(n)), HOUR_MS)
            usage = _usage(server, n)
            usage["TOTAL used_memory delta"] = round((server.used_memory() - base) / n, 1)
            print(f"\n{kind}: bytes per scheduled message")
            for k, v in usage.items():
                print(f"  {v:7.1f}  {k}")
            broker.close()

        broker = make_broker("redisson", server.url)
        actor = declare(broker)
        keys = broker.keys(QUEUE)
        prepared: list[tuple[Any, str]] = [broker.prepare_scheduled(actor.message(i)) for i in range(n)]
        print("\nRedissonBroker layouts written with plain commands: used_memory delta per message")
        results = {}
        for name, short_list, compact in (
            ("full", False, False),
            ("installed", False, True),
            ("installed + list-of-keys", True, True),
        ):
            server.flush()
            base = server.used_memory()
            for start in range(0, n, 5000):
                with server.r.pipeline(transaction=False) as pipe:
                    chunk = prepared[start : start + 5000]
                    members = {m.options["redis_message_id"]: 0 for m, _ in chunk}
                    pipe.zadd(keys.timeout_zset, {mem: 1 for mem in members})
                    pipe.rpush(keys.backup_list, *([k for _, k in chunk] if short_list else list(members)))
                    payload = {
                        m.message_id: k.encode() + (encode_scheduled(m, k) if compact else m.encode()) for m, k in chunk
                    }
                    pipe.hset(keys.payloads, mapping=payload)
                    pipe.execute()
            results[name] = round((server.used_memory() - base) / n, 1)
            print(f"  {results[name]:7.1f}  {name}")
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
