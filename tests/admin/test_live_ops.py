"""Live-fleet operations on a real server: pause and resume a queue (two worker processes),
running now, and the activity history (counts, the per-hour roll-up, the ring laps)."""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import dramatiq
import pytest
import redis
from dramatiq import Actor, Worker

from dramatiq_redisson import RedissonBroker
from dramatiq_redisson._consumer import consumer_token
from dramatiq_redisson.admin._history import RING_HOURS, RING_MINUTES
from tests.helpers import records, server_ms, wait_for
from tests.test_processes import worker_processes

SLOT = 16


def starts(client: redis.Redis) -> list[dict[str, Any]]:
    return [r for r in records(client) if r.get("started")]


def runs(client: redis.Redis) -> list[int]:
    return [r["i"] for r in records(client) if not r.get("started") and "i" in r]


# -- pause / resume -------------------------------------------------------------------------


def test_pause_with_two_worker_processes_starts_nothing_and_resume_starts_within_a_second(
    broker: RedissonBroker,
    redis_url: str,
    redis_client: redis.Redis,
    stamp: dramatiq.Actor,  # type: ignore[type-arg]
) -> None:
    env = {"HOLD_S": "0.3", "THREADS": "2"}
    with worker_processes(redis_url, redis_client, count=2, env=env):
        for i in range(12):
            stamp.send(i)
        for i in range(12, 20):
            stamp.send_with_options(args=(i,), delay=800 + 100 * (i - 12))
        assert wait_for(lambda: len(starts(redis_client)) >= 4, timeout=10)
        assert broker.pause("default") is True
        paused_at = server_ms(redis_client)
        assert broker.pause("default") is False  # already paused: nothing changes
        for i in range(20, 25):
            stamp.send(i)  # sends are accepted while paused
        time.sleep(3.0)
        late = [r for r in starts(redis_client) if r["at_ms"] > paused_at + 1000]
        assert late == [], "a message started more than 1 s after the pause"
        stats = broker.stats("default")["queues"]["default"]
        assert stats["paused"] and stats["paused_since_ms"] is not None
        assert abs(stats["paused_since_ms"] - paused_at) < 1000
        assert stats["in_flight"] == 0, "messages in flight at the pause finish"
        assert stats["scheduled"] == 0 and stats["overdue"] == 0, "due messages still move while paused"
        waiting = stats["ready"]
        assert waiting > 0 and waiting + len(set(runs(redis_client))) == 25

        assert broker.resume("default") is True
        resumed_at = server_ms(redis_client)
        assert broker.resume("default") is False
        assert wait_for(lambda: any(r["at_ms"] >= resumed_at for r in starts(redis_client)), timeout=5)
        first = min(r["at_ms"] for r in starts(redis_client) if r["at_ms"] >= resumed_at)
        assert first - resumed_at <= 1000, f"first start {first - resumed_at} ms after the resume"
        assert wait_for(lambda: len(runs(redis_client)) >= 25, timeout=20)
    assert sorted(runs(redis_client)) == list(range(25)), "each message ran exactly once"
    assert broker.stats("default")["queues"]["default"]["paused"] is False


def test_a_worker_that_boots_on_a_paused_queue_stays_idle_until_resumed(
    broker: RedissonBroker,
    redis_url: str,
    redis_client: redis.Redis,
    stamp: dramatiq.Actor,  # type: ignore[type-arg]
) -> None:
    broker.declare_queue("default")
    assert broker.pause("default")
    for i in range(5):
        stamp.send(i)
    with worker_processes(redis_url, redis_client, count=1):
        time.sleep(1.5)
        assert runs(redis_client) == []
        assert broker.stats("default")["queues"]["default"]["ready"] == 5
        broker.resume("default")
        assert wait_for(lambda: len(runs(redis_client)) == 5, timeout=5)


def test_a_paused_queue_hands_nothing_off_in_a_transfer_and_leaves_the_idle_registry(
    broker: RedissonBroker,
    redis_client: redis.Redis,
    stamp: dramatiq.Actor,  # type: ignore[type-arg]
) -> None:
    keys = broker.keys("default")
    scripts = broker.redisson_scripts
    broker.declare_queue("default")
    assert scripts.fetch(keys, "w1", 4, "tok") == []  # short: registered as idle
    assert redis_client.zscore(keys.idle, "tok") == 4
    broker.pause("default")
    assert scripts.fetch(keys, "w1", 4, "tok") is None
    assert redis_client.zscore(keys.idle, "tok") is None
    stamp.send_with_options(args=(1,), delay=1)
    time.sleep(0.05)
    result = scripts.transfer(
        keys,
        limit=10,
        trim_budget=10,
        compact_step=10,
        compact_slack=10,
        token="tok",
        lease_ms=2000,
        own_slots=4,
        worker_id="w1",
    )
    assert result.moved == 1 and result.fetched == []
    assert redis_client.llen(keys.ready) == 1 and redis_client.scard(keys.acks("w1")) == 0
    broker.resume("default")
    fetched = scripts.fetch(keys, "w1", 4, "tok")
    assert fetched is not None and len(fetched) == 1


def test_pause_and_resume_refuse_an_unknown_queue_and_write_nothing(
    broker: RedissonBroker, redis_client: redis.Redis
) -> None:
    with pytest.raises(ValueError, match="unknown queue 'nope'"):
        broker.pause("nope")
    with pytest.raises(ValueError, match="unknown queue 'nope'.*no queue is known yet"):
        broker.resume("nope")
    assert redis_client.exists(broker.keys("nope").paused) == 0


# -- running now ------------------------------------------------------------------------------


def test_running_shows_a_sleeping_actors_message_with_its_worker_and_age_then_drops_it(
    broker: RedissonBroker, redis_client: redis.Redis, sleeper: tuple[Actor[[], None], threading.Event]
) -> None:
    sleepy, release = sleeper
    message = sleepy.send()
    assert wait_for(lambda: len(broker.running("slow")) == 1)
    time.sleep(0.3)
    [entry] = broker.running()
    assert entry["message_id"] == message.message_id and entry["actor"] == "sleepy"
    assert entry["queue"] == "slow" and entry["worker_id"] == broker.broker_id
    assert entry["pid"] == os.getpid() and entry["host"] == consumer_token("x").split(":")[0]
    assert entry["age_ms"] >= 300 and entry["fetched_ms"] <= server_ms(redis_client) - 300
    release.set()
    assert wait_for(lambda: broker.running("slow") == [])
    assert redis_client.hlen(broker.keys("slow").fetched) == 0


def test_a_fetch_takes_the_clock_estimate_for_its_record(
    broker: RedissonBroker,
    redis_client: redis.Redis,
    stamp: dramatiq.Actor,  # type: ignore[type-arg]
) -> None:
    """With an estimate of the server clock (from a transfer or an enqueue), the fetch
    records the fetch time from it instead of a TIME call."""
    keys, scripts = broker.keys("default"), broker.redisson_scripts
    stamp.send(1)
    ms = server_ms(redis_client) - 3_600_000  # an estimate an hour behind, to tell it apart
    scripts._clocks["default"] = (ms * 1000, time.monotonic())
    [(redis_id, _)] = scripts.fetch(keys, "w1", 1) or []
    record = redis_client.hget(keys.fetched, redis_id)
    assert record is not None
    assert 0 <= int(record.split(b"|")[0]) - ms < 1000


def test_running_lists_oldest_first_and_ignores_a_record_whose_message_is_gone(
    broker: RedissonBroker,
    redis_client: redis.Redis,
    stamp: dramatiq.Actor,  # type: ignore[type-arg]
) -> None:
    keys = broker.keys("default")
    first = stamp.send(1)
    fetched = broker.redisson_scripts.fetch(keys, "w1", 1, "host-a:11:w1:1")
    time.sleep(0.01)
    second = stamp.send(2)
    # Not listening on its wake channel (no token for the idle registry): still recorded.
    assert broker.redisson_scripts.fetch(keys, "w2", 1, "", "host-b:22:w2:1")
    listed = broker.running("default")
    assert [m["message_id"] for m in listed] == [first.message_id, second.message_id]
    assert [(m["host"], m["pid"]) for m in listed] == [("host-a", 11), ("host-b", 22)]
    # A record left behind (its message acked by a path that did not delete it) never shows.
    assert fetched
    redis_client.srem(keys.acks("w1"), fetched[0][0])
    assert [m["message_id"] for m in broker.running("default")] == [second.message_id]


# -- activity history -----------------------------------------------------------------------


def test_history_counts_successes_retries_and_failures(broker: RedissonBroker) -> None:
    @dramatiq.actor(queue_name="mixed", max_retries=1, min_backoff=1, max_backoff=1)
    def outcome(kind: str) -> None:
        if kind == "fail":
            raise ValueError("always")
        if kind == "flaky" and not flaky_seen.setdefault("done", False):
            flaky_seen["done"] = True
            raise ValueError("once")

    flaky_seen: dict[str, bool] = {}
    worker = Worker(broker, worker_threads=2, worker_timeout=100)
    worker.start()
    try:
        for kind in ["ok"] * 5 + ["fail"] * 2 + ["flaky"]:
            outcome.send(kind)
        broker.join("mixed", timeout=10_000)
        worker.join()
    finally:
        worker.stop()
    # ok ×5 and the flaky message's second run: processed 6; "fail" ×2 dead-lettered after one
    # retry each, and flaky's first run retried: retried 3.
    expected = {"processed": 6, "failed": 2, "retried": 3}
    stats = broker.stats("mixed")["queues"]["mixed"]
    assert stats["last_hour"] == expected and stats["last_day"] == expected
    history = broker.history("mixed", minutes=5, hours=3)["queues"]["mixed"]
    assert len(history["minutes"]) == 5 and len(history["hours"]) == 3
    summed = {k: sum(b[k] for b in history["minutes"]) for k in expected}  # type: ignore[literal-required]
    assert summed == expected
    assert history["minutes"][-1]["start_ms"] - history["minutes"][0]["start_ms"] == 4 * 60_000
    with pytest.raises(ValueError, match="minutes must be an int from 1 to 1440"):
        broker.history("mixed", minutes=0)
    with pytest.raises(ValueError, match="hours must be an int from 1 to 720"):
        broker.history("mixed", hours=721)


def _slot(client: redis.Redis, key: str, at: int) -> tuple[int, int, int, int]:
    raw = client.getrange(key, at, at + SLOT - 1).ljust(SLOT, b"\0")
    return tuple(int.from_bytes(raw[i : i + 4], "big") for i in range(0, SLOT, 4))  # type: ignore[return-value]


def test_history_rolls_a_finished_minute_into_its_hour_once_and_reads_past_stale_laps(
    broker: RedissonBroker,
    redis_client: redis.Redis,
    stamp: dramatiq.Actor,  # type: ignore[type-arg]
) -> None:
    keys = broker.keys("default")
    now_minute = server_ms(redis_client) // 60_000
    earlier = now_minute - 90  # an active minute an hour and a half ago, not yet rolled up
    # Its slot holds {earlier: 7 processed, 1 failed, 2 retried}; the header names it.
    at = 16 + SLOT * (earlier % RING_MINUTES)
    redis_client.setrange(keys.minutes, 0, earlier.to_bytes(4, "big"))
    redis_client.setrange(keys.minutes, at, b"".join(n.to_bytes(4, "big") for n in (earlier, 7, 1, 2)))
    # A stale slot one lap back where the current minute lands, and a stale hour slot.
    lap = now_minute - RING_MINUTES
    redis_client.setrange(
        keys.minutes,
        16 + SLOT * (now_minute % RING_MINUTES),
        b"".join(n.to_bytes(4, "big") for n in (lap, 50, 50, 50)),
    )
    old_hour = earlier // 60 - RING_HOURS
    redis_client.setrange(
        keys.hours, SLOT * ((earlier // 60) % RING_HOURS), b"".join(n.to_bytes(4, "big") for n in (old_hour, 9, 9, 9))
    )
    # Before any event this minute, a reader adds the pending minute to its hour itself.
    hours = broker.history("default", minutes=1, hours=3)["queues"]["default"]["hours"]
    by_hour = {b["start_ms"] // 3_600_000: b for b in hours}
    assert by_hour[earlier // 60]["processed"] == 7 and by_hour[earlier // 60]["retried"] == 2
    # The first ack of this minute rolls the earlier minute into its hour (replacing the stale lap).
    stamp.send(1)
    [(redis_id, _)] = broker.redisson_scripts.fetch(keys, "w1", 1) or []
    assert broker.redisson_scripts.ack(keys, "w1", redis_id) == 1
    assert _slot(redis_client, keys.hours, SLOT * ((earlier // 60) % RING_HOURS)) == (earlier // 60, 7, 1, 2)
    minute_slot = _slot(redis_client, keys.minutes, 16 + SLOT * (now_minute % RING_MINUTES))
    assert minute_slot[1:] == (1, 0, 0) and minute_slot[0] in (now_minute, now_minute + 1)
    history = broker.history("default", minutes=120, hours=3)["queues"]["default"]
    assert sum(b["processed"] for b in history["hours"]) == 8
    assert sum(b["processed"] for b in history["minutes"]) == 8
    assert sum(b["failed"] for b in history["minutes"]) == 1
    # A repeated ack (a retry after a lost reply) counts nothing.
    assert broker.redisson_scripts.ack(keys, "w1", redis_id) == 0
    assert broker.stats("default")["queues"]["default"]["last_hour"]["processed"] == 1


def test_an_acks_clock_estimate_behind_or_ahead_counts_each_event_once_per_minute_and_hour(
    broker: RedissonBroker,
    redis_client: redis.Redis,
    stamp: dramatiq.Actor,  # type: ignore[type-arg]
) -> None:
    """An ack takes the consumer's estimate of the server clock instead of TIME; two
    consumers' estimates can sit on either side of a minute's start. A late event of a
    minute already rolled up into its hour still counts once in both rings."""
    keys = broker.keys("default")
    scripts = broker.redisson_scripts
    minute = server_ms(redis_client) // 60_000 - 5

    def ack_at(ms: int) -> None:
        stamp.send(1)
        [(redis_id, _)] = scripts.fetch(keys, "w1", 1) or []
        scripts._clocks["default"] = (ms * 1000, time.monotonic())
        assert scripts.server_now_ms("default") == str(ms)
        assert scripts.ack(keys, "w1", redis_id) == 1

    def totals() -> tuple[int, int]:
        history = broker.history("default", minutes=60, hours=3)["queues"]["default"]
        assert sum(b["failed"] + b["retried"] for b in history["hours"]) == 0  # nothing from a lap before
        return sum(b["processed"] for b in history["minutes"]), sum(b["processed"] for b in history["hours"])

    # The hour slot of M-1 holds a lap before: a late event starts it again from its count.
    late_hour = (minute - 1) // 60
    redis_client.setrange(
        keys.hours,
        SLOT * (late_hour % RING_HOURS),
        b"".join(n.to_bytes(4, "big") for n in (late_hour - RING_HOURS, 9, 9, 9)),
    )
    ack_at(minute * 60_000 + 10)  # minute M opens (the header names it)
    ack_at(minute * 60_000 - 5)  # a late first event of M-1: its hour gets it directly
    ack_at(minute * 60_000 - 1)  # a late event of M-1 again
    assert _slot(redis_client, keys.minutes, 16 + SLOT * ((minute - 1) % RING_MINUTES)) == (minute - 1, 2, 0, 0)
    assert _slot(redis_client, keys.minutes, 0)[0] == minute  # the header still names M
    assert totals() == (3, 3)
    ack_at((minute + 1) * 60_000)  # M+1 opens: M is rolled up into its hour, once
    assert totals() == (4, 4)
    # No estimate (none yet, or older than CLOCK_ESTIMATE_TTL): the ack reads TIME.
    stamp.send(1)
    [(redis_id, _)] = scripts.fetch(keys, "w1", 1) or []
    scripts._clocks.pop("default")
    assert scripts.server_now_ms("default") == ""
    assert scripts.ack(keys, "w1", redis_id) == 1
    assert totals() == (5, 5)
