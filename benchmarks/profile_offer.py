"""Profile the offer paths: where does one delayed enqueue spend its time?

    python -m benchmarks.profile_offer [--n 20000] [--bulk 100000] [--url URL]

For RedissonBroker one by one, RedissonBroker.enqueue_many and the built-in broker one by
one: wall time, the server's script time (INFO commandstats, EVALSHA) and the client's
share (the rest), then the top functions by own time (cProfile).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import time
from typing import Any

from ._base import HOUR_MS, QUEUE, quiet_logging
from ._brokers import make_broker
from ._server import Server


def _measure(server: Server, label: str, fn: Any, n: int, top: int) -> None:
    server.flush()
    server.reset_stats()
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.enable()
    fn()
    prof.disable()
    wall = time.perf_counter() - t0
    calls, usec = server.evalsha_stats()
    print(
        f"\n### {label}: {n} messages, {n / wall:.0f} msgs/s under cProfile "
        f"(wall {wall * 1e6 / n:.1f} µs/msg; server scripts {usec / n:.1f} µs/msg in {calls} calls)"
    )
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(top)
    lines = out.getvalue().splitlines()
    start = next(i for i, line in enumerate(lines) if "ncalls" in line)
    print("\n".join(lines[start : start + top + 1]))


def lua_variants(server: Server) -> None:
    """Server µs per one-entry offer.lua call, and per variant with a piece removed."""
    import statistics
    import uuid

    from dramatiq_redisson import QueueKeys

    from ._internals import lua_dir

    src = (lua_dir() / "offer.lua").read_text()
    variants = {
        "return only (script call overhead)": "return {1}",
        "TIME only": "local t = redis.call('TIME') return {1}",
        "offer.lua": src,
        "offer.lua without the HGET of a previous schedule": src.replace(
            'local previous = redis.call("HGET", payloads, message_id)', "local previous = nil"
        ),
        "offer.lua without the ZRANGE head check": src.replace("if any_added then", "if false then"),
        "TIME + ZADD + RPUSH + HSET only": """local t = redis.call("TIME")
redis.call("ZADD", KEYS[1], ARGV[2], ARGV[3] .. ARGV[4])
redis.call("RPUSH", KEYS[2], ARGV[3] .. ARGV[4])
redis.call("HSET", KEYS[3], ARGV[4], ARGV[3] .. ARGV[5])
return {1}""",
    }
    k = QueueKeys("dramatiq", QUEUE)
    keys = [k.timeout_zset, k.backup_list, k.payloads, k.channel, k.legacy_dq, k.legacy_dq_msgs]
    data = b'{"queue_name":"bench","actor_name":"bench_record","args":[1],"kwargs":{},"options":{"redis_message_id":"'
    data += b"0" * 52 + b'"},"message_id":"' + b"y" * 36 + b'","message_timestamp":1}'
    out: dict[str, list[float]] = {n: [] for n in variants}
    for _ in range(3):
        for name, body in variants.items():
            server.flush()
            script = server.r.register_script(body)
            for i in range(2000):
                script(keys=keys, args=["rel", HOUR_MS, f"{i:016x}", str(uuid.uuid4()), data, ""])
            server.r.config_resetstat()
            for i in range(3000):
                script(keys=keys, args=["rel", HOUR_MS, f"{i + 5000:016x}", str(uuid.uuid4()), data, ""])
            out[name].append(server.r.info("commandstats")["cmdstat_evalsha"]["usec_per_call"])
    for name, values in out.items():
        print(f"{name:52s} {statistics.median(values):6.1f} µs/call  (runs {values})")


def main(argv: list[str] | None = None) -> int:
    from ._actor import declare

    parser = argparse.ArgumentParser(prog="python -m benchmarks.profile_offer")
    parser.add_argument("--n", type=int, default=20_000)
    parser.add_argument("--bulk", type=int, default=100_000)
    parser.add_argument("--top", type=int, default=14)
    parser.add_argument("--url", default=None)
    parser.add_argument("--lua", action="store_true", help="price the parts of offer.lua instead")
    args = parser.parse_args(argv)
    quiet_logging()
    server = Server(args.url)
    if args.lua:
        try:
            lua_variants(server)
        finally:
            server.stop()
        return 0
    try:
        plans: list[tuple[str, Any, int]] = []
        for kind in ("redisson", "builtin"):
            broker = make_broker(kind, server.url)
            actor = declare(broker)
            actor.send_with_options(args=(-1,), delay=HOUR_MS)

            def one(actor: Any = actor) -> None:
                for seq in range(args.n):
                    actor.send_with_options(args=(seq,), delay=HOUR_MS)

            plans.append((f"{kind} one by one", one, args.n))
            if kind == "redisson":
                messages = [actor.message(seq) for seq in range(args.bulk)]

                def bulk(broker: Any = broker, messages: Any = messages) -> None:
                    broker.enqueue_many(messages, delay=HOUR_MS)

                plans.append(("redisson enqueue_many", bulk, args.bulk))
        print("## without profiler (3 runs each): msgs/s, server script µs/msg")
        for label, fn, n in plans:
            runs = []
            for _ in range(3):
                server.flush()
                runs.append(server.script_rate(fn, n))
            print(f"{label:24s} " + "  ".join(f"{r:8.0f}/s {s:5.1f} µs" for r, s in runs))
        for label, fn, n in plans:
            _measure(server, label, fn, n, args.top)
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
