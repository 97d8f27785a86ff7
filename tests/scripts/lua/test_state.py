"""state.lua: where one message is on one queue, by its message id (scheduled, ready,
running, dead, done or unknown), with its last progress report; reads only. And the done
record ack.lua writes for it while ``done_retention`` is on (the +done group)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import redis

from dramatiq_redisson._ids import next_sort_key, sort_key_at
from dramatiq_redisson._keys import QueueKeys
from dramatiq_redisson.scripts._contract import contract

from .state import Lua, schedule_entry, snapshot

MID = "3f0c2d9e-8b1a-4c4e-9f55-0a1b2c3d4e5f"
CLOCK = 1_700_000_000_000  # epoch ms


def _keys(keys: QueueKeys) -> list[str]:
    """state.lua's KEYS, as scripts._calls.Scripts.message_state passes them."""
    return [
        keys.payloads,
        keys.timeout_zset,
        keys.ready_msgs,
        keys.fetched,
        keys.xq,
        keys.xq_msgs,
        keys.done,
        keys.ready,
        keys.lane_of,
        keys.progress,
    ]


State = Callable[..., dict[str, Any]]


@pytest.fixture
def state(lua: Lua, keys: QueueKeys) -> State:
    """state.lua for ``message_id`` (``search``: ids read at each end of a list), its
    reply by slot name, the state decoded."""
    script = lua("state")

    def call(message_id: str = MID, search: int = 0) -> dict[str, Any]:
        reply = contract("state").reply(script(keys=_keys(keys), args=[message_id, search, keys.lane_prefix]))
        reply["state"] = reply["state"].decode()
        return reply

    return call


def _moved(message_id: str = MID) -> str:
    """The redis id of ``message_id`` moved from the delayed queue: its member."""
    return next_sort_key() + message_id


def test_state_of_a_message_nothing_holds_is_unknown_and_writes_nothing(
    state: State, redis_client: redis.Redis, server_ms: Callable[[], int]
) -> None:
    before = server_ms()
    reply = state(search=100)
    assert reply["state"] == "unknown"
    assert before <= reply["now_ms"] <= server_ms()
    assert (reply["redis_message_id"], reply["data"], reply["at_ms"], reply["complete"]) == (b"", b"", -1, 1)
    assert snapshot(redis_client) == {}


def test_state_of_a_scheduled_message_is_its_member_payload_and_due_time(
    state: State, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    entry = schedule_entry(redis_client, keys, MID, CLOCK + 60_000, data=b"payload")
    before = snapshot(redis_client)
    reply = state()
    assert reply["state"] == "scheduled"
    assert reply["redis_message_id"] == entry.member
    assert reply["data"] == entry.sort_key.encode() + b"payload"
    assert reply["at_ms"] == CLOCK + 60_000
    assert snapshot(redis_client) == before  # reads only


def test_state_of_a_periodic_tick_is_found_by_its_message_id(
    state: State, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    tick = f"periodic:nightly:{CLOCK}"
    schedule_entry(redis_client, keys, tick, CLOCK, sort_key=sort_key_at(CLOCK))
    reply = state(tick)
    assert (reply["state"], reply["redis_message_id"], reply["at_ms"]) == (
        "scheduled",
        (sort_key_at(CLOCK) + tick).encode(),
        CLOCK,
    )


def test_state_of_an_immediate_send_is_ready_then_running_by_its_fetch_record(
    state: State, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    redis_client.rpush(keys.ready, MID)
    redis_client.hset(keys.ready_msgs, MID, b"encoded")
    ready = state()
    assert (ready["state"], ready["redis_message_id"], ready["data"], ready["record"]) == (
        "ready",
        MID.encode(),
        b"encoded",
        b"",
    )
    redis_client.lpop(keys.ready)
    redis_client.hset(keys.fetched, MID, f"{CLOCK}|w1|host:12:ab:1")
    running = state()
    assert (running["state"], running["record"]) == ("running", f"{CLOCK}|w1|host:12:ab:1".encode())


def test_state_of_a_moved_message_takes_a_search(state: State, keys: QueueKeys, redis_client: redis.Redis) -> None:
    member = _moved()
    redis_client.rpush(keys.ready, "other", member, "another")
    redis_client.hset(keys.ready_msgs, member, b"encoded")
    assert state(search=0)["state"] == "unknown"  # its sort key is not in its message id
    reply = state(search=10)
    assert (reply["state"], reply["redis_message_id"], reply["complete"]) == ("ready", member.encode(), 1)


def test_state_search_finds_a_moved_message_in_flight_among_the_fetch_records(
    state: State, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    member = _moved()
    redis_client.hset(keys.ready_msgs, member, b"encoded")
    redis_client.hset(keys.fetched, mapping={member: f"{CLOCK}|w1|tok", _moved("m-2"): f"{CLOCK}|w1|tok"})
    reply = state(search=1)
    assert (reply["state"], reply["redis_message_id"]) == ("running", member.encode())


def test_state_search_looks_in_the_lane_a_laned_message_went_to(
    state: State, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    member = _moved()
    redis_client.hset(keys.lane_of, MID, "5:")
    redis_client.rpush(keys.lane("5:"), member)
    redis_client.hset(keys.ready_msgs, member, b"encoded")
    reply = state(search=10)
    assert (reply["state"], reply["redis_message_id"]) == ("ready", member.encode())


@pytest.mark.parametrize(("position", "found"), [(1, True), (11, False), (23, True)])
def test_state_search_reads_both_ends_of_a_long_lane_and_says_when_it_read_part(
    state: State, keys: QueueKeys, redis_client: redis.Redis, position: int, found: bool
) -> None:
    # Given a ready list of 25 ids, the message's at `position`, and a search of 5 at each end
    member = _moved()
    ids = [_moved(f"other-{n}") for n in range(25)]
    ids[position] = member
    redis_client.rpush(keys.ready, *ids)
    redis_client.hset(keys.ready_msgs, member, b"encoded")
    reply = state(search=5)
    # Then it is found near either end, and in the middle it is not, and the reply says so
    assert reply["state"] == ("ready" if found else "unknown")
    assert reply["complete"] == (1 if found else 0)


def test_state_search_takes_only_members_of_that_very_message_id(
    state: State, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    # Ids that end with the message id but are not a sort key and it
    near = [next_sort_key() + "x" + MID, next_sort_key()[:13] + MID, "x" + MID]
    redis_client.rpush(keys.ready, *near)
    redis_client.hset(keys.ready_msgs, mapping=dict.fromkeys(near, b"encoded"))
    assert state(search=10)["state"] == "unknown"


def test_state_of_a_dead_letter_by_its_message_id_or_among_the_newest(
    state: State, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    redis_client.zadd(keys.xq, {MID: CLOCK})
    redis_client.hset(keys.xq_msgs, MID, b"failed")
    reply = state()
    assert (reply["state"], reply["redis_message_id"], reply["data"], reply["at_ms"]) == (
        "dead",
        MID.encode(),
        b"failed",
        CLOCK,
    )
    # A moved message's dead letter: found among the newest `search` dead letters only
    other = "aaaaaaaa-8b1a-4c4e-9f55-0a1b2c3d4e5f"
    member = _moved(other)
    redis_client.zadd(keys.xq, {member: CLOCK + 1, **{f"d{n}": CLOCK + 2 + n for n in range(3)}})
    redis_client.hset(keys.xq_msgs, member, b"moved and failed")
    assert state(other, search=4)["redis_message_id"] == member.encode()
    assert state(other, search=3)["state"] == "unknown"
    assert state(other, search=3)["complete"] == 0


def test_state_of_a_message_with_a_done_record_is_done_and_the_later_of_dead_and_done_wins(
    state: State, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    redis_client.zadd(keys.done, {MID: CLOCK})
    assert (state()["state"], state()["at_ms"]) == ("done", CLOCK)
    redis_client.zadd(keys.xq, {MID: CLOCK - 1})  # it died, was sent again and succeeded
    assert state()["state"] == "done"
    redis_client.zadd(keys.xq, {MID: CLOCK + 1})  # it succeeded, was sent again and died
    assert state()["state"] == "dead"


def test_state_prefers_a_live_copy_to_a_record_and_a_schedule_to_a_run(
    state: State, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    redis_client.zadd(keys.done, {MID: CLOCK})
    redis_client.hset(keys.ready_msgs, MID, b"encoded")
    redis_client.hset(keys.fetched, MID, f"{CLOCK}|w1|tok")
    assert state()["state"] == "running"
    schedule_entry(redis_client, keys, MID, CLOCK + 1000)  # its retry, sent before the failed run's ack
    assert state()["state"] == "scheduled"


def test_state_carries_the_last_progress_report(state: State, keys: QueueKeys, redis_client: redis.Redis) -> None:
    redis_client.hset(keys.progress, MID, f"0.25|{CLOCK}|a | note")
    assert state()["progress"] == f"0.25|{CLOCK}|a | note".encode()  # unknown: its data is gone
    redis_client.hset(keys.ready_msgs, MID, b"encoded")
    reply = state()
    assert (reply["state"], reply["progress"]) == ("ready", f"0.25|{CLOCK}|a | note".encode())


# -- the done record ack.lua writes (its +done group) -----------------------------------------


def _ack_keys(keys: QueueKeys, *, idle: bool = False) -> list[str]:
    base = [keys.acks("w1"), keys.ready_msgs, keys.heartbeats, keys.fetched, *keys.history_keys]
    return [*base, *([keys.idle, keys.ready] if idle else []), keys.done]


def _fetched(client: redis.Redis, keys: QueueKeys, *ids: str) -> None:
    client.sadd(keys.acks("w1"), *ids)
    client.hset(keys.ready_msgs, mapping=dict.fromkeys(ids, b"data"))
    client.hset(keys.fetched, mapping=dict.fromkeys(ids, f"{CLOCK}|w1|tok"))


def test_ack_with_the_done_group_records_the_message_once(lua: Lua, keys: QueueKeys, redis_client: redis.Redis) -> None:
    _fetched(redis_client, keys, "r1")
    ack = lua("ack")
    assert ack(keys=_ack_keys(keys), args=["r1", "w1", "0", "1", CLOCK, "done", MID, ""]) == 1
    assert redis_client.zrange(keys.done, 0, -1, withscores=True) == [(MID.encode(), CLOCK)]
    assert redis_client.pttl(keys.done) == -1  # no trim asked: the key is left as it was
    # A repeated ack (its reply was lost) finds nothing to ack and records nothing again
    assert ack(keys=_ack_keys(keys), args=["r1", "w1", "0", "1", CLOCK + 5, "done", MID, ""]) == 0
    assert redis_client.zrange(keys.done, 0, -1, withscores=True) == [(MID.encode(), CLOCK)]


def test_ack_trim_drops_records_older_than_the_retention_and_sets_the_key_to_expire(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    redis_client.zadd(keys.done, {"old": CLOCK - 10_001, "edge": CLOCK - 10_000, "young": CLOCK - 1})
    _fetched(redis_client, keys, "r1")
    lua("ack")(keys=_ack_keys(keys), args=["r1", "w1", "0", "1", CLOCK, "done", MID, "10000"])
    assert redis_client.zrange(keys.done, 0, -1) == [b"edge", b"young", MID.encode()]
    assert 10_000 < redis_client.pttl(keys.done) <= 70_000


def test_ack_with_the_done_group_after_the_idle_group_records_too(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    _fetched(redis_client, keys, "r1")
    redis_client.zadd(keys.idle, {"tok": 0})
    args = ["r1", "w1", "0", "1", CLOCK, "idle", "tok", 3, keys.wake_channel("tok"), "done", MID, ""]
    assert lua("ack")(keys=_ack_keys(keys, idle=True), args=args) == 1
    assert redis_client.zscore(keys.idle, "tok") == 3
    assert redis_client.zscore(keys.done, MID) == CLOCK


def test_ack_without_the_done_group_writes_no_record(lua: Lua, keys: QueueKeys, redis_client: redis.Redis) -> None:
    _fetched(redis_client, keys, "r1")
    assert lua("ack")(keys=_ack_keys(keys)[:-1], args=["r1", "w1", "0", "1", CLOCK]) == 1
    assert not redis_client.exists(keys.done)
