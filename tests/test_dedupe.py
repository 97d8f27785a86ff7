"""Issue 11: deduplicate, debounce and throttle scheduled messages by a dedupe key.

``send_with_options(delay=…, dedupe_key=…, dedupe="keep" | "replace", dedupe_ttl=…)``,
``DelayedQueue.get_by_key`` / ``remove_by_key``; the key index (see include/dedupe_split.lua) is
checked against the scheduled set after every operation.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import dramatiq
import pytest
import redis
from dramatiq import Worker
from dramatiq.message import Message

from dramatiq_redisson import RedissonBroker
from dramatiq_redisson._ids import sort_key_length
from dramatiq_redisson._keys import QueueKeys
from tests.helpers import record, records, server_ms, wait_for

ROOT = Path(__file__).resolve().parent.parent
HOUR = 3_600_000


def assert_index_exact(client: redis.Redis, keys: QueueKeys) -> dict[str, str]:
    """The dedupe-key index names exactly the scheduled keyed messages: every key ->
    id entry has a scheduled message whose reverse entry names the key, and back; no
    key is both held by a scheduled message and in a throttle window. Returns the
    index as {key: message id}."""
    index = {k.decode(): v.decode() for k, v in client.hgetall(keys.dedupe).items()}
    reverse = {k.decode(): v.decode() for k, v in client.hgetall(keys.keyed).items()}
    assert len(index) == len(reverse), (index, reverse)
    for key, message_id in index.items():
        stored = client.hget(keys.payloads, message_id)
        assert stored is not None, f"index names {message_id!r} for {key!r}, which is not scheduled"
        assert client.zscore(keys.timeout_zset, stored[: sort_key_length(stored)] + message_id.encode()) is not None
        ttl, _, named = reverse[message_id].partition(":")
        assert named == key and int(ttl) >= 0
    windows = {k.decode() for k in client.zrange(keys.holds, 0, -1)}
    assert not windows & set(index), windows & set(index)
    return index


def move_due(broker: RedissonBroker, queue_name: str = "default") -> int:
    """Run one operator's transfer (no lease): move every due message to the ready queue."""
    keys = broker.keys(queue_name)
    result = broker.redisson_scripts.transfer(
        keys, limit=1000, trim_budget=100, compact_step=100, compact_slack=100, window_ms=broker.dedupe_window
    )
    return result.moved


@pytest.fixture
def keyed(broker: RedissonBroker, redis_client: redis.Redis) -> dramatiq.Actor:  # type: ignore[type-arg]
    @dramatiq.actor(max_retries=0)
    def keyed(i: int) -> None:
        record(redis_client, i=i)

    return keyed


# -- keep ----------------------------------------------------------------------------------


def test_keep_writes_nothing_while_the_key_is_held_and_returns_the_waiting_message(
    broker: RedissonBroker,
    redis_client: redis.Redis,
    keyed: dramatiq.Actor,  # type: ignore[type-arg]
) -> None:
    keys = broker.keys("default")
    first = keyed.send_with_options(args=(1,), delay=HOUR, dedupe_key="reindex:42")
    before = redis_client.hgetall(keys.payloads), redis_client.zrange(keys.timeout_zset, 0, -1, withscores=True)
    again = keyed.send_with_options(args=(2,), delay=10, dedupe_key="reindex:42", dedupe="keep")
    # Nothing written: same payloads, same due times; the waiting message comes back.
    assert (
        redis_client.hgetall(keys.payloads),
        redis_client.zrange(keys.timeout_zset, 0, -1, withscores=True),
    ) == before
    assert again.message_id == first.message_id and again.args == (1,)
    assert again.options["eta"] == first.options["eta"]
    assert again.options["redis_message_id"] == first.options["redis_message_id"]
    # The default mode is keep.
    assert keyed.send_with_options(args=(3,), delay=10, dedupe_key="reindex:42").message_id == first.message_id
    queue = broker.delayed_queue("default")
    assert queue.size() == 1
    due, message = queue.get_by_key("reindex:42")  # type: ignore[misc]
    assert due == first.options["eta"] and message.message_id == first.message_id and message.args == (1,)
    assert assert_index_exact(redis_client, keys) == {"reindex:42": first.message_id}
    # The caller can cancel what it got back; the key is free again.
    assert queue.remove(again.message_id)
    assert assert_index_exact(redis_client, keys) == {} and queue.get_by_key("reindex:42") is None
    fresh = keyed.send_with_options(args=(4,), delay=HOUR, dedupe_key="reindex:42")
    assert fresh.message_id != first.message_id and queue.size() == 1


def test_keep_then_the_message_runs_once_with_the_first_arguments(
    broker: RedissonBroker,
    redis_client: redis.Redis,
    keyed: dramatiq.Actor,  # type: ignore[type-arg]
    worker: Worker,
) -> None:
    sent = [keyed.send_with_options(args=(i,), delay=300, dedupe_key="once") for i in range(10)]
    assert len({m.message_id for m in sent}) == 1
    assert wait_for(lambda: len(records(redis_client)) >= 1, timeout=10)
    time.sleep(0.5)
    assert [r["i"] for r in records(redis_client)] == [0]
    assert assert_index_exact(redis_client, broker.keys("default")) == {}


# -- replace (debounce) ------------------------------------------------------------------


def test_debounce_runs_once_with_the_last_arguments_delay_after_the_last_send(
    broker: RedissonBroker,
    redis_client: redis.Redis,
    keyed: dramatiq.Actor,  # type: ignore[type-arg]
    worker: Worker,
) -> None:
    delay = 1_500  # generous against a stalled producer on a noisy host
    last: Message[Any] | None = None
    for i in range(50):
        last = keyed.send_with_options(args=(i,), delay=delay, dedupe_key="edit:7", dedupe="replace")
        assert broker.delayed_queue("default").size() == 1
        time.sleep(0.02)
    assert last is not None and last.args == (49,)
    assert wait_for(lambda: len(records(redis_client)) >= 1, timeout=15)
    time.sleep(0.5)  # a second run would show up now
    runs = records(redis_client)
    assert [r["i"] for r in runs] == [49]
    # Not earlier than delay after the last send (server clock: its stored due time).
    assert runs[0]["at_ms"] >= last.options["eta"]
    assert assert_index_exact(redis_client, broker.keys("default")) == {}


def test_replace_supersedes_the_waiting_message(
    broker: RedissonBroker,
    redis_client: redis.Redis,
    keyed: dramatiq.Actor,  # type: ignore[type-arg]
) -> None:
    keys = broker.keys("default")
    queue = broker.delayed_queue("default")
    first = keyed.send_with_options(args=(1,), delay=HOUR, dedupe_key="k", dedupe="replace")
    second = keyed.send_with_options(args=(2,), delay=2 * HOUR, dedupe_key="k", dedupe="replace")
    assert second.message_id != first.message_id and second.args == (2,)
    assert second.options["eta"] > first.options["eta"]
    assert queue.size() == 1 and not queue.contains(first.message_id) and queue.contains(second.message_id)
    assert not queue.remove(first.message_id)
    due, message = queue.get_by_key("k")  # type: ignore[misc]
    assert (due, message.args) == (second.options["eta"], (2,))
    assert assert_index_exact(redis_client, keys) == {"k": second.message_id}
    # A keep send after a replace still finds the key held.
    assert keyed.send_with_options(args=(3,), delay=10, dedupe_key="k").message_id == second.message_id


# -- throttle ------------------------------------------------------------------------------


def test_throttle_window_drops_sends_after_the_message_moved_until_ttl_ends(
    broker: RedissonBroker,
    redis_client: redis.Redis,
    keyed: dramatiq.Actor,  # type: ignore[type-arg]
) -> None:
    keys = broker.keys("default")
    queue = broker.delayed_queue("default")
    ttl = 1_500
    first = keyed.send_with_options(args=(1,), delay=HOUR, dedupe_key="tick", dedupe_ttl=ttl)
    assert queue.promote(first.message_id) and move_due(broker) == 1
    moved_at = server_ms(redis_client)
    assert queue.size() == 0 and redis_client.llen(keys.ready) == 1
    window_end = redis_client.zscore(keys.holds, "tick")
    assert window_end is not None and moved_at - 50 <= window_end - ttl <= moved_at
    assert 0 < redis_client.pttl(keys.holds) <= ttl and 0 < redis_client.pttl(keys.throttle_copies) <= ttl
    assert queue.get_by_key("tick") is None
    assert assert_index_exact(redis_client, keys) == {}
    # In the window, keep and replace sends write nothing and return the message that ran.
    for mode in ("keep", "replace"):
        assert server_ms(redis_client) < window_end
        dropped = keyed.send_with_options(args=(2,), delay=10, dedupe_key="tick", dedupe=mode)
        assert dropped.message_id == first.message_id and dropped.args == (1,)
        assert dropped.options["redis_message_id"] == first.options["redis_message_id"]
    assert queue.size() == 0 and redis_client.llen(keys.ready) == 1
    # After the window, the key is free.
    assert wait_for(lambda: server_ms(redis_client) > window_end + 5, timeout=5)
    later = keyed.send_with_options(args=(3,), delay=HOUR, dedupe_key="tick", dedupe_ttl=ttl)
    assert later.message_id != first.message_id and queue.size() == 1
    assert redis_client.zscore(keys.holds, "tick") is None and not redis_client.hexists(keys.throttle_copies, "tick")
    assert assert_index_exact(redis_client, keys) == {"tick": later.message_id}


def test_throttle_at_most_one_run_per_window_with_a_worker(
    broker: RedissonBroker,
    redis_client: redis.Redis,
    keyed: dramatiq.Actor,  # type: ignore[type-arg]
    worker: Worker,
) -> None:
    ttl = 60_000
    for i in range(20):
        keyed.send_with_options(args=(i,), delay=50, dedupe_key="minute", dedupe_ttl=ttl)
        time.sleep(0.03)
    assert wait_for(lambda: len(records(redis_client)) >= 1, timeout=10)
    time.sleep(0.5)
    assert [r["i"] for r in records(redis_client)] == [0]


def test_ended_windows_are_trimmed_by_later_moves(
    broker: RedissonBroker,
    redis_client: redis.Redis,
    keyed: dramatiq.Actor,  # type: ignore[type-arg]
) -> None:
    keys = broker.keys("default")
    queue = broker.delayed_queue("default")
    for i, ttl in enumerate([100, 100, 100, 100, HOUR]):
        message = keyed.send_with_options(args=(i,), delay=HOUR, dedupe_key=f"w{i}", dedupe_ttl=ttl)
        queue.promote(message.message_id)
    assert move_due(broker) == 5 and redis_client.zcard(keys.holds) == 5
    # The keys expire with their latest window (an hour), not with the short ones.
    assert HOUR - 60_000 < redis_client.pttl(keys.holds) <= HOUR
    short_end = int(redis_client.zscore(keys.holds, "w0") or 0)
    assert wait_for(lambda: server_ms(redis_client) > short_end + 5, timeout=5)
    # A window that ended no longer holds its key (sends do not trim: nothing changes).
    again = keyed.send_with_options(args=(10,), delay=HOUR, dedupe_key="w1")
    assert again.args == (10,) and redis_client.zcard(keys.holds) == 4
    # The next move that opens a window trims the ended ones.
    queue.promote(keyed.send_with_options(args=(9,), delay=HOUR, dedupe_key="t", dedupe_ttl=HOUR).message_id)
    assert move_due(broker) == 1
    assert sorted(k.decode() for k in redis_client.zrange(keys.holds, 0, -1)) == ["t", "w4"]
    assert sorted(redis_client.hkeys(keys.throttle_copies)) == [b"t", b"w4"]
    assert_index_exact(redis_client, keys)


# -- retries -------------------------------------------------------------------------------


@pytest.mark.parametrize("ttl", [0, 60_000], ids=["no-ttl", "ttl"])
def test_a_pending_retry_holds_its_key_like_the_original(
    broker: RedissonBroker, redis_client: redis.Redis, make_worker: Callable[..., Worker], ttl: int
) -> None:
    keys = broker.keys("default")
    broker.declare_queue("default")  # (a queue must be known to be operated)
    queue = broker.delayed_queue("default")

    @dramatiq.actor(max_retries=3, min_backoff=60_000, max_backoff=60_000)
    def flaky(i: int) -> None:
        record(redis_client, i=i)
        if i == 1:
            raise RuntimeError("first try fails")

    original = flaky.send_with_options(args=(1,), delay=10, dedupe_key="job", dedupe_ttl=ttl)
    make_worker()

    # The first run fails: its retry is scheduled (backoff about a minute) under the key.
    def retry_pending() -> bool:
        found = queue.get_by_key("job")
        return found is not None and found[1].options.get("retries") == 1

    assert wait_for(retry_pending, timeout=10)
    due, pending = queue.get_by_key("job")  # type: ignore[misc]
    assert pending.message_id == original.message_id and pending.options.get("retries") == 1
    assert redis_client.zscore(keys.holds, "job") is None  # the retry ended the throttle window
    assert assert_index_exact(redis_client, keys) == {"job": original.message_id}
    # A keep send while the retry waits is dropped and returns the retry.
    kept = flaky.send_with_options(args=(2,), delay=10, dedupe_key="job")
    assert kept.message_id == original.message_id and kept.options["eta"] == due
    assert queue.size() == 1
    # A replace send supersedes it: the new message runs, the retry never does.
    new = flaky.send_with_options(args=(3,), delay=100, dedupe_key="job", dedupe="replace")
    assert new.message_id != original.message_id and not queue.contains(original.message_id)
    assert wait_for(lambda: [r["i"] for r in records(redis_client)] == [1, 3], timeout=10)
    assert queue.size() == 0 or queue.get_by_key("job") is None
    time.sleep(0.3)
    assert [r["i"] for r in records(redis_client)] == [1, 3]
    assert assert_index_exact(redis_client, keys) == {}


def test_a_retry_is_dropped_when_another_message_took_the_key_meanwhile(
    broker: RedissonBroker, redis_client: redis.Redis, make_worker: Callable[..., Worker]
) -> None:
    keys = broker.keys("default")

    @dramatiq.actor(max_retries=3, min_backoff=100, max_backoff=100)
    def slow(i: int) -> None:
        record(redis_client, i=i)
        if i == 1:
            assert wait_for(lambda: bool(redis_client.exists("test:go")), timeout=10)
            raise RuntimeError("fails after the key was taken again")

    slow.send_with_options(args=(1,), delay=10, dedupe_key="job")
    make_worker()
    assert wait_for(lambda: len(records(redis_client)) == 1, timeout=10)  # running: the key is free
    taken = slow.send_with_options(args=(2,), delay=1_000, dedupe_key="job")
    assert broker.delayed_queue("default").get_by_key("job") is not None
    redis_client.set("test:go", 1)
    # The retry of 1 finds the key held by 2: it is dropped; 2 runs once.
    assert wait_for(lambda: [r["i"] for r in records(redis_client)] == [1, 2], timeout=10)
    time.sleep(0.5)
    assert [r["i"] for r in records(redis_client)] == [1, 2]
    assert broker.delayed_queue("default").size() == 0
    assert taken.message_id not in {m.message_id for _, m in broker.delayed_queue("default").read_all()}
    assert assert_index_exact(redis_client, keys) == {}


# -- races ---------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["keep", "replace"])
def test_four_processes_racing_on_one_key(
    broker: RedissonBroker, redis_url: str, redis_client: redis.Redis, mode: str
) -> None:
    keys = broker.keys("default")
    sends, procs_count = 40, 4
    env = {
        **os.environ,
        "REDIS_URL": redis_url,
        "MODE": mode,
        "SENDS": str(sends),
        "KEY": "race",
        "DELAY": str(HOUR),
        "PYTHONPATH": str(ROOT),
    }
    procs = [
        subprocess.Popen([sys.executable, "-m", "tests.dedupe_sender"], env=env, cwd=ROOT) for _ in range(procs_count)
    ]
    try:
        assert wait_for(lambda: int(redis_client.get("test:senders-ready") or 0) == procs_count, timeout=60)
        redis_client.set("test:go", 1)
        for proc in procs:
            assert proc.wait(timeout=60) == 0
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    sent = [json.loads(r) for r in redis_client.lrange("test:sent", 0, -1)]
    assert len(sent) == sends * procs_count
    queue = broker.delayed_queue("default")
    assert queue.size() == 1 and redis_client.hlen(keys.payloads) == 1
    index = assert_index_exact(redis_client, keys)
    (scheduled,) = index.values()
    if mode == "keep":
        # Exactly one send got through; every send returned that message.
        assert sum(1 for r in sent if r["sent"] == r["returned"]) == 1
        assert {r["returned"] for r in sent} == {scheduled}
    else:
        # Every send got through in turn; what is left is the last one the server ran:
        # some process's last send, with the latest due time of all.
        assert all(r["sent"] == r["returned"] for r in sent)
        assert scheduled in {r["sent"] for r in sent if r["last"]}
        due, _ = queue.get_by_key("race")  # type: ignore[misc]
        assert due == max(r["eta"] for r in sent)


def test_threads_racing_with_enqueue_many_and_send(
    broker: RedissonBroker,
    redis_client: redis.Redis,
    keyed: dramatiq.Actor,  # type: ignore[type-arg]
) -> None:
    def send() -> None:
        for i in range(20):
            keyed.send_with_options(args=(i,), delay=HOUR, dedupe_key="t", dedupe="replace")
            broker.enqueue_many([keyed.message_with_options(args=(i,), dedupe_key="t")], delay=HOUR)

    threads = [threading.Thread(target=send) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert broker.delayed_queue("default").size() == 1
    assert len(assert_index_exact(redis_client, broker.keys("default"))) == 1


# -- keys per queue; get/remove by key -----------------------------------------------------


def test_keys_on_different_queues_are_independent(broker: RedissonBroker, redis_client: redis.Redis) -> None:
    @dramatiq.actor(queue_name="a")
    def on_a() -> None: ...

    @dramatiq.actor(queue_name="b")
    def on_b() -> None: ...

    a = on_a.send_with_options(delay=HOUR, dedupe_key="same")
    b = on_b.send_with_options(delay=HOUR, dedupe_key="same")
    assert a.message_id != b.message_id
    assert broker.delayed_queue("a").get_by_key("same")[1].message_id == a.message_id  # type: ignore[index]
    assert broker.delayed_queue("b").get_by_key("same")[1].message_id == b.message_id  # type: ignore[index]
    assert broker.delayed_queue("a").remove_by_key("same")
    assert broker.delayed_queue("a").get_by_key("same") is None
    assert broker.delayed_queue("b").get_by_key("same") is not None
    assert on_b.send_with_options(delay=10, dedupe_key="same").message_id == b.message_id
    for name in ("a", "b"):
        assert_index_exact(redis_client, broker.keys(name))


def test_remove_by_key_cancels_and_releases(
    broker: RedissonBroker,
    redis_client: redis.Redis,
    keyed: dramatiq.Actor,  # type: ignore[type-arg]
) -> None:
    queue = broker.delayed_queue("default")
    message = keyed.send_with_options(args=(1,), delay=HOUR, dedupe_key="c")
    keyed.send_with_options(args=(2,), delay=HOUR)
    assert not queue.remove_by_key("unknown")
    assert queue.remove_by_key("c") and not queue.contains(message.message_id)
    assert not queue.remove_by_key("c")
    assert queue.size() == 1 and queue.get_by_key("c") is None
    assert assert_index_exact(redis_client, broker.keys("default")) == {}


# -- the index stays exact through every operation ----------------------------------------


def test_key_released_when_the_message_moves_is_promoted_cleared_or_removed(
    broker: RedissonBroker,
    redis_client: redis.Redis,
    keyed: dramatiq.Actor,  # type: ignore[type-arg]
) -> None:
    keys = broker.keys("default")
    queue = broker.delayed_queue("default")

    def send(key: str, delay: int = HOUR) -> Message[Any]:
        return keyed.send_with_options(args=(0,), delay=delay, dedupe_key=key)

    # Moves (promote, then the transfer).
    moved = send("m")
    assert queue.promote(moved.message_id)
    assert assert_index_exact(redis_client, keys) == {"m": moved.message_id}  # promoted: still scheduled
    assert move_due(broker) == 1
    assert assert_index_exact(redis_client, keys) == {}
    # promote_all, then moved.
    send("p1"), send("p2")
    assert queue.promote_all() == 2 and move_due(broker) == 2
    assert assert_index_exact(redis_client, keys) == {}
    # remove (by id), remove_all (earliest first, and by actor: the members path).
    removed = send("r")
    assert queue.remove(removed.message_id) and assert_index_exact(redis_client, keys) == {}
    for i in range(3):
        send(f"all{i}")
    assert queue.remove_all(limit=2) == 2 and len(assert_index_exact(redis_client, keys)) == 1
    assert queue.remove_all(actor_name="keyed") == 1 and assert_index_exact(redis_client, keys) == {}
    # clear.
    for i in range(3):
        send(f"c{i}")
    keyed.send_with_options(args=(1,), delay=HOUR)
    assert queue.clear() == 4
    assert redis_client.exists(keys.dedupe, keys.keyed) == 0 and assert_index_exact(redis_client, keys) == {}
    # reschedule keeps the key.
    kept = send("k")
    assert queue.reschedule(kept.message_id, delay=2 * HOUR)
    assert assert_index_exact(redis_client, keys) == {"k": kept.message_id}
    # flush drops everything, throttle windows included.
    windowed = keyed.send_with_options(args=(0,), delay=HOUR, dedupe_key="w", dedupe_ttl=HOUR)
    queue.promote(windowed.message_id)
    move_due(broker)
    assert redis_client.zcard(keys.holds) == 1
    broker.flush("default")
    assert redis_client.exists(keys.dedupe, keys.keyed, keys.holds, keys.throttle_copies) == 0


def test_offering_a_keyed_message_again_without_its_key_releases_it(
    broker: RedissonBroker,
    redis_client: redis.Redis,
    keyed: dramatiq.Actor,  # type: ignore[type-arg]
) -> None:
    keys = broker.keys("default")
    queue = broker.delayed_queue("default")
    for how in ("one", "bulk", "migration", "other-key"):
        message = keyed.send_with_options(args=(1,), delay=HOUR, dedupe_key="x")
        assert assert_index_exact(redis_client, keys) == {"x": message.message_id}
        plain = Message(
            queue_name=message.queue_name,
            actor_name=message.actor_name,
            args=(2,),
            kwargs={},
            options={},
            message_id=message.message_id,
            message_timestamp=message.message_timestamp,
        )
        if how == "one":
            broker.enqueue(plain, delay=HOUR)
        elif how == "bulk":
            broker.enqueue_many([plain], delay=HOUR)
        elif how == "migration":
            prepared, sort_key = broker.prepare_scheduled(plain)
            entry = (server_ms(redis_client) + HOUR, sort_key, plain.message_id, prepared.encode(), "")
            broker.redisson_scripts.offer(keys, [entry], absolute=True)
        else:
            plain.options["dedupe_key"] = "y"
            broker.enqueue(plain, delay=HOUR)
        expected = {"y": message.message_id} if how == "other-key" else {}
        assert assert_index_exact(redis_client, keys) == expected
        assert queue.size() == 1 and queue.get(message.message_id)[1].args == (2,)  # type: ignore[index]
        queue.clear()


def test_enqueue_many_with_keys(
    broker: RedissonBroker,
    redis_client: redis.Redis,
    keyed: dramatiq.Actor,  # type: ignore[type-arg]
) -> None:
    keys = broker.keys("default")
    queue = broker.delayed_queue("default")
    # keep: the first of the batch is scheduled; the others come back as it.
    kept = broker.enqueue_many([keyed.message_with_options(args=(i,), dedupe_key="b") for i in range(5)], delay=HOUR)
    assert len({m.message_id for m in kept}) == 1 and all(m.args == (0,) for m in kept)
    assert all(m.options["eta"] == kept[0].options["eta"] for m in kept)
    # replace: the last of the batch wins; plain messages in the same batch are scheduled.
    batch = [keyed.message_with_options(args=(i,), dedupe_key="d", dedupe="replace") for i in range(5)]
    batch.append(keyed.message(99))
    replaced = broker.enqueue_many(batch, delay=HOUR)
    assert [m.message_id for m in replaced] == [m.message_id for m in batch]
    assert queue.get_by_key("d")[1].args == (4,)  # type: ignore[index]
    assert queue.size() == 3 and queue.contains(batch[-1].message_id)
    assert assert_index_exact(redis_client, keys) == {"b": kept[0].message_id, "d": batch[4].message_id}


# -- bad input -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("delay", "options", "match"),
    [
        (None, {"dedupe_key": "k"}, "delay"),
        (0, {"dedupe_key": "k", "dedupe": "replace"}, "delay"),
        (-5, {"dedupe_key": "k"}, "delay"),
        (HOUR, {"dedupe_key": "k", "dedupe": "skip"}, "dedupe must be one of"),
        (HOUR, {"dedupe": "keep"}, "need a dedupe_key"),
        (HOUR, {"dedupe_ttl": 100}, "need a dedupe_key"),
        (HOUR, {"dedupe_key": ""}, "non-empty str"),
        (HOUR, {"dedupe_key": 42}, "non-empty str"),
        (HOUR, {"dedupe_key": "k", "dedupe_ttl": -1}, "dedupe_ttl"),
        (HOUR, {"dedupe_key": "k", "dedupe_ttl": 1.5}, "dedupe_ttl"),
        (HOUR, {"dedupe_key": "k", "dedupe_ttl": True}, "dedupe_ttl"),
        (HOUR, {"dedupe_key": "k", "dedupe_ttl": timedelta(seconds=1)}, "dedupe_ttl"),
    ],
)
def test_bad_dedupe_options_raise_before_anything_is_written(
    broker: RedissonBroker,
    redis_client: redis.Redis,
    keyed: dramatiq.Actor,  # type: ignore[type-arg]
    delay: int | None,
    options: dict[str, Any],
    match: str,
) -> None:
    declared = set(redis_client.keys("*"))  # the queue registry: the actor's queue was declared
    with pytest.raises(ValueError, match=match):
        keyed.send_with_options(args=(1,), delay=delay, **options)
    with pytest.raises(ValueError, match=match):
        broker.enqueue_many([keyed.message(0), keyed.message_with_options(args=(1,), **options)], delay=delay)
    assert set(redis_client.keys("*")) == declared
