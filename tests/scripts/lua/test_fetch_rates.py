"""fetch.lua's rate limits (flow_take.lua): at most ``rate`` starts in any window of
``per_ms`` on the server clock, per queue and per group. A fetch takes no more than the
queue's start log allows now; a lane whose group spent its rate waits off its ring in the
``deferred`` ZSET until its group may start again; one short consumer is told to sleep
until the next start (``wait:<ms>``, the flow's ``rate_at``), and when it fetches then it
wakes as many idle consumers as the starts allowed need."""

from __future__ import annotations

from collections.abc import Callable

import redis

from dramatiq_redisson._keys import PLAIN_LANE, QueueKeys, lane_id

from .state import Lua, fetch_flow, turn_flow_on

CLOCK = 1_700_000_000_000


def _ready(client: redis.Redis, keys: QueueKeys, lane: str, *ids: str) -> None:
    if client.rpush(keys.lane(lane), *ids) == len(ids) and lane != PLAIN_LANE:
        priority = int(lane.split(":")[0])
        client.rpush(keys.ring(priority), lane)
        client.zadd(keys.levels, {str(priority): priority})
    client.hset(keys.ready_msgs, mapping={i: f"data-{i}".encode() for i in ids})


def _wait(status: str) -> int | None:
    words = [w for w in status.split() if w.startswith("wait:")]
    return int(words[0][5:]) if words else None


def _log(client: redis.Redis, key: str) -> list[int]:
    return [int(t) for t in client.lrange(key, 0, -1)]


def test_a_fetch_takes_no_more_than_the_queues_rate_allows_and_one_consumer_sleeps_until_the_next_start(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis, server_ms: Callable[[], int]
) -> None:
    turn_flow_on(redis_client, keys, rate=2, per_ms=10_000)
    _ready(redis_client, keys, PLAIN_LANE, *(f"m{n}" for n in range(5)))
    before = server_ms()
    ids, status = fetch_flow(lua, keys, 5, CLOCK, token="tok-1")
    assert ids == [b"m0", b"m1"]
    wait = _wait(status)
    assert wait is not None and 9_000 <= wait <= 10_000
    assert "slots" in status.split()
    starts = _log(redis_client, keys.rate_log())
    assert len(starts) == 2 and all(before <= t <= server_ms() for t in starts)
    assert redis_client.pttl(keys.rate_log()) == -1  # one key, never longer than the rate
    assert int(redis_client.hget(keys.flow, "rate_at")) == starts[-1] + 10_000
    # Another consumer: nothing to take, and no sleep of its own (one consumer waits).
    assert fetch_flow(lua, keys, 5, CLOCK, token="tok-2") == ([], "")
    assert redis_client.zscore(keys.idle, "tok-2") == 5  # idle: woken when a start is allowed
    assert redis_client.llen(keys.ready) == 3  # the rest stay queued


def test_starts_that_left_the_window_are_dropped_and_count_no_more(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis, server_ms: Callable[[], int]
) -> None:
    now = server_ms()
    turn_flow_on(redis_client, keys, rate=3, per_ms=1_000)
    redis_client.rpush(keys.rate_log(), now - 100, now - 900, now - 1_500, now - 2_000)  # newest first
    _ready(redis_client, keys, PLAIN_LANE, "a", "b", "c")
    ids, _ = fetch_flow(lua, keys, 5, CLOCK)
    assert ids == [b"a"]  # two starts still in the window, one allowed
    assert _log(redis_client, keys.rate_log())[1:] == [now - 100, now - 900]


def test_a_lowered_rate_counts_the_starts_already_made_and_waits_for_enough_of_them_to_leave(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis, server_ms: Callable[[], int]
) -> None:
    now = server_ms()
    turn_flow_on(redis_client, keys, rate=2, per_ms=60_000)
    redis_client.rpush(keys.rate_log(), now - 10, now - 20, now - 30, now - 40)
    _ready(redis_client, keys, PLAIN_LANE, "a")
    ids, status = fetch_flow(lua, keys, 5, CLOCK, token="tok")
    assert ids == []
    # Allowed again when the 2nd newest start leaves the window.
    assert int(redis_client.hget(keys.flow, "rate_at")) == now - 20 + 60_000
    assert status.startswith("wait:")


def test_a_group_over_its_rate_waits_off_its_ring_while_other_groups_run(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis, server_ms: Callable[[], int]
) -> None:
    turn_flow_on(redis_client, keys, group_rate=1, per_ms=10_000)
    a, b = lane_id(0, "a"), lane_id(0, "b")
    _ready(redis_client, keys, a, "a1", "a2", "a3")
    _ready(redis_client, keys, b, "b1")
    ids, status = fetch_flow(lua, keys, 5, CLOCK, token="tok")
    assert ids == [b"a1", b"b1"]
    deferred = redis_client.zrange(keys.deferred, 0, -1, withscores=True)
    assert [lane for lane, _ in deferred] == [a.encode()]
    (start,) = _log(redis_client, keys.rate_log("a"))
    assert 0 < redis_client.pttl(keys.rate_log("a")) <= 10_000  # a group's: gone a window after its last start
    assert deferred[0][1] == start + 10_000 == int(redis_client.hget(keys.flow, "deferred_at"))
    assert redis_client.llen(keys.ring(0)) == 0  # a waits off the ring, b is empty
    wait = _wait(status)
    assert wait is not None and 9_000 <= wait <= 10_000
    assert _log(redis_client, keys.rate_log()) == []  # no queue rate: no queue log
    # Once the group may start again (its start left the window), its lane is back in turn.
    redis_client.delete(keys.rate_log("a"))
    redis_client.zadd(keys.deferred, {a: server_ms() - 1})
    redis_client.hset(keys.flow, "deferred_at", server_ms() - 1)
    ids, _ = fetch_flow(lua, keys, 5, CLOCK, token="tok")
    assert ids == [b"a2"]
    assert redis_client.zrange(keys.deferred, 0, -1) == [a.encode()]  # spent again


def test_messages_without_a_group_are_not_held_by_a_group_rate(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    turn_flow_on(redis_client, keys, group_rate=1, per_ms=10_000)
    _ready(redis_client, keys, lane_id(2, None), "p1", "p2", "p3")
    ids, status = fetch_flow(lua, keys, 5, CLOCK)
    assert ids == [b"p1", b"p2", b"p3"]
    assert status == "slots"


def test_the_consumer_that_sleeps_for_the_rate_wakes_the_others_when_more_may_start(
    lua: Lua,
    keys: QueueKeys,
    redis_client: redis.Redis,
    server_ms: Callable[[], int],
    listen: Callable[[str], Callable[[], list[bytes]]],
) -> None:
    turn_flow_on(redis_client, keys, rate=10, per_ms=10_000, rate_at=server_ms() - 5)
    _ready(redis_client, keys, PLAIN_LANE, *(f"m{n}" for n in range(8)))
    redis_client.zadd(keys.idle, {"tok-1": 2, "tok-2": 4, "tok-3": 4})
    woken = {t: listen(keys.wake_channel(t)) for t in ("tok-1", "tok-2", "tok-3")}
    ids, status = fetch_flow(lua, keys, 2, CLOCK, token="tok-1")
    assert ids == [b"m0", b"m1"] and status == "slots"
    # 8 more starts allowed, 6 ready: the idle consumers with the most slots first, itself aside.
    assert {t: w() for t, w in woken.items()} == {"tok-1": [], "tok-2": [b"0"], "tok-3": [b"0"]}
    assert not redis_client.hexists(keys.flow, "rate_at")
    assert not redis_client.hexists(keys.flow, "rate_waiter")


def test_an_earlier_next_start_makes_a_new_sleeper_and_a_later_one_does_not(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis, server_ms: Callable[[], int]
) -> None:
    far = server_ms() + 3_600_000
    turn_flow_on(redis_client, keys, rate=1, per_ms=1_000, rate_at=far)
    redis_client.rpush(keys.rate_log(), server_ms())
    _ready(redis_client, keys, PLAIN_LANE, "a")
    ids, status = fetch_flow(lua, keys, 1, CLOCK, token="tok")
    assert ids == [] and _wait(status) is not None  # due in about a second, before `far`
    assert int(redis_client.hget(keys.flow, "rate_at")) < far
    assert fetch_flow(lua, keys, 1, CLOCK, token="tok-2") == ([], "")


def test_the_sleeper_asking_again_before_its_time_is_told_to_sleep_on_and_others_are_not(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    turn_flow_on(redis_client, keys, rate=1, per_ms=5_000)
    _ready(redis_client, keys, PLAIN_LANE, "a", "b")
    assert fetch_flow(lua, keys, 2, CLOCK, token="tok-1")[0] == [b"a"]
    assert redis_client.hget(keys.flow, "rate_waiter") == b"tok-1"
    # (an idle poll of the sleeper itself, before the start it sleeps for)
    ids, status = fetch_flow(lua, keys, 2, CLOCK, token="tok-1")
    assert ids == [] and _wait(status) is not None
    assert fetch_flow(lua, keys, 2, CLOCK, token="tok-2") == ([], "")
    assert redis_client.hget(keys.flow, "rate_waiter") == b"tok-1"
