"""Where does a delayed message's lateness come from? One RedissonConsumer, no Worker.

    python -m benchmarks.diagnose_timer [--n 500] [--rate 100] [--far 0] [--url URL]

Offers ``n`` messages (delays uniform 0.2–3 s, paced at ``rate``/s) while one consumer is
iterated in a thread, as Dramatiq's ConsumerThread does (``next()``, ack). The transfer
script is wrapped to log every call's server time and moved count. Reported, per message:

- timer: server time of the first transfer call at or after its due time − due time
  (how late the timer ran the transfer that moved it);
- received: when ``next()`` returned it (host clock = server clock) − due time.
"""

from __future__ import annotations

import argparse
import random
import threading
import time
from bisect import bisect_left
from typing import Any

from ._base import HOUR_MS, QUEUE, quiet_logging
from ._brokers import bulk_offer, make_broker
from ._measure import pct
from ._server import Server


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.diagnose_timer")
    parser.add_argument("--n", type=int, default=500)
    parser.add_argument("--rate", type=float, default=100.0)
    parser.add_argument("--far", type=int, default=0, help="messages due in 1 h offered first")
    parser.add_argument("--url", default=None)
    args = parser.parse_args(argv)
    quiet_logging()
    from ._actor import declare

    server = Server(args.url)
    try:
        server.flush()
        broker = make_broker("redisson", server.url)
        actor = declare(broker)
        if args.far:
            bulk_offer(broker, "redisson", actor, list(range(10**9, 10**9 + args.far)), HOUR_MS)
        consumer_broker = make_broker("redisson", server.url)
        declare(consumer_broker)
        calls: list[tuple[int, int, float]] = []  # (server now ms, moved, local ms at return)
        scripts = consumer_broker.redisson_scripts
        original = scripts.transfer

        def transfer(*a: Any, **kw: Any) -> Any:
            result = original(*a, **kw)
            calls.append((result.server_now_us // 1000, result.moved, time.time() * 1000))
            return result

        scripts.transfer = transfer
        consumer = consumer_broker.consume(QUEUE, prefetch=8, timeout=1000)
        received: dict[int, float] = {}
        stop = threading.Event()

        def consume() -> None:
            while not stop.is_set():
                msg = next(consumer)
                if msg is not None:
                    received[msg.args[0]] = time.time() * 1000
                    consumer.ack(msg)

        thread = threading.Thread(target=consume, daemon=True)
        thread.start()
        time.sleep(1.0)
        rng = random.Random(3)
        dues: dict[int, float] = {}
        t0 = time.monotonic()
        for seq in range(args.n):
            time.sleep(max(0.0, t0 + seq / args.rate - time.monotonic()))
            actor.send_with_options(args=(seq,), delay=rng.randint(200, 3000))
            dues[seq] = float(broker.bench_last_dues[0])
        deadline = time.monotonic() + 10
        while len(received) < args.n and time.monotonic() < deadline:
            time.sleep(0.05)
        stop.set()
        thread.join(5)
        consumer.close()
        moving = sorted((now, moved) for now, moved, _ in calls if moved)
        times = [now for now, _ in moving]
        timer, recv = [], []
        for seq, due in dues.items():
            i = bisect_left(times, due)
            if i < len(times):
                timer.append(times[i] - due)
            if seq in received:
                recv.append(received[seq] - due)
        print(
            f"{args.n} messages at {args.rate}/s, {args.far} far; {len(calls)} transfer calls, "
            f"{len(moving)} moved something; received {len(received)}"
        )
        print("timer   (transfer server time - due, ms):", pct(timer))
        print("received (next() returned - due, ms):    ", pct(recv))
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
