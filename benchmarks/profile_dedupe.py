"""What a dedupe key costs a send, on an empty queue and behind a large keyed backlog.

    python -m benchmarks.profile_dedupe [--backlog 1000000] [--n 5000] [--url URL]

For plain sends, keyed sends that go through (distinct keys, "keep"), keyed sends that
are dropped (the key is held) and "replace" sends (each cancels the previous holder):
msgs/s from one process and the server's script time per send (INFO commandstats,
EVALSHA), first on an empty queue, then with ``--backlog`` keyed messages scheduled (so
the ZSET and both index hashes hold that many entries).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from ._base import HOUR_MS, QUEUE, quiet_logging
from ._brokers import make_broker
from ._server import Server

#: Entries per streamed offer call while filling the backlog.
FILL_CHUNK = 200


def _fill(broker: Any, actor: Any, count: int) -> None:
    """Schedule ``count`` keyed messages (key ``fill:<i>``), streamed in calls of
    :data:`FILL_CHUNK` entries."""
    from ._internals import encode_scheduled, next_sort_keys

    keys = broker.keys(QUEUE)
    for start in range(0, count, 50 * FILL_CHUNK):
        calls = []
        for chunk_start in range(start, min(count, start + 50 * FILL_CHUNK), FILL_CHUNK):
            size = min(FILL_CHUNK, count - chunk_start)
            args: list[Any] = ["rel"]
            for i, sort_key in zip(range(chunk_start, chunk_start + size), next_sort_keys(size), strict=True):
                message, _ = broker.prepare_scheduled(actor.message(i), sort_key)
                data = encode_scheduled(message, sort_key)
                args.extend((HOUR_MS, sort_key, message.message_id, data, "", f"fill:{i}", "keep", 0))
            calls.append((keys, args))
        outcomes = broker.redisson_scripts.offer_calls(calls)
        bad = [o for o in outcomes if not isinstance(o, list)]
        if bad:
            raise RuntimeError(f"filling failed: {bad[0]!r}")


def main(argv: list[str] | None = None) -> int:
    from ._actor import declare

    parser = argparse.ArgumentParser(prog="python -m benchmarks.profile_dedupe")
    parser.add_argument("--backlog", type=int, default=1_000_000)
    parser.add_argument("--n", type=int, default=5_000)
    parser.add_argument("--url", default=None)
    args = parser.parse_args(argv)
    quiet_logging()
    server = Server(args.url)
    try:
        server.flush()
        broker = make_broker("redisson", server.url)
        actor = declare(broker)
        actor.send_with_options(args=(-1,), delay=HOUR_MS)
        n = args.n
        round_no = iter(range(1_000_000))

        def plain() -> None:
            for seq in range(n):
                actor.send_with_options(args=(seq,), delay=HOUR_MS)

        def keyed() -> None:
            r = next(round_no)
            for seq in range(n):
                actor.send_with_options(args=(seq,), delay=HOUR_MS, dedupe_key=f"k{r}:{seq}")

        def dropped() -> None:
            for seq in range(n):
                actor.send_with_options(args=(seq,), delay=HOUR_MS, dedupe_key="held")

        def replace() -> None:
            for seq in range(n):
                actor.send_with_options(args=(seq,), delay=HOUR_MS, dedupe_key="debounced", dedupe="replace")

        plans = [("plain", plain), ("keyed", keyed), ("keyed, dropped", dropped), ("keyed, replace", replace)]
        for label, backlog in (("empty queue", 0), (f"{args.backlog:,} keyed scheduled", args.backlog)):
            if backlog:
                t0 = time.perf_counter()
                _fill(broker, actor, backlog)
                print(f"(filled {backlog:,} in {time.perf_counter() - t0:.0f} s)")
            print(f"## {label}: {n} sends each, 3 interleaved rounds: msgs/s, server script µs/send")
            results: dict[str, list[tuple[float, float]]] = {name: [] for name, _ in plans}
            for _ in range(3):
                for name, fn in plans:
                    results[name].append(server.script_rate(fn, n))
            plain_rate = sorted(r for r, _ in results["plain"])[1]
            for name, runs in results.items():
                rate = sorted(r for r, _ in runs)[1]
                usec = sorted(u for _, u in runs)[1]
                print(f"{name:16s} median {rate:7.0f}/s ({rate / plain_rate:.2f}x plain), {usec:5.1f} µs/send")
        broker.close()
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
