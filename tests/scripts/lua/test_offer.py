"""offer.lua: schedule messages on a queue's delayed-queue structures in one atomic call.

Modes: "rel" (delays on the server clock), "abs" (epoch ms, legacy migration with claims
of .DQ ids), "move:<id>" (a retry that first drops its in-flight copy's payload) and
"bulk" (one delay for many entries). Re-offering a scheduled id reschedules it (the last
offer of an id in one call wins); a member that already came due is not scheduled again
(-2); dedupe keys keep, replace or hold entries (and throttle windows drop sends, -3);
a new earliest entry's due time is announced on the channel."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pytest
import redis

from dramatiq_redisson._ids import next_sort_key, next_sort_keys
from dramatiq_redisson._keys import QueueKeys, lane_id

from .state import Lua, snapshot

FAR = 9_000_000_000_000


def _offer_keys(keys: QueueKeys) -> list[str]:
    return [
        keys.timeout_zset,
        keys.backup_list,
        keys.payloads,
        keys.channel,
        keys.legacy_dq,
        keys.legacy_dq_msgs,
        keys.ready_msgs,
        keys.sent,
        keys.dedupe,
        keys.keyed,
        keys.holds,
        keys.throttle_copies,
    ]


def _entry(
    time_ms: int,
    sort_key: str,
    message_id: str,
    data: bytes = b"{}",
    claim: str = "",
    key: str = "",
    mode: str = "",
    ttl: int = 0,
) -> list[Any]:
    return [time_ms, sort_key, message_id, data, claim, key, mode, ttl]


def _offer(lua: Lua, keys: QueueKeys, mode: str, *entries: Sequence[Any]) -> Any:
    args: list[Any] = [mode]
    for entry in entries:
        args.extend(entry)
    return lua("offer")(keys=_offer_keys(keys), args=args)


def _bulk(lua: Lua, keys: QueueKeys, delay: int, pairs: Sequence[tuple[str, bytes]]) -> Any:
    args: list[Any] = ["bulk", delay]
    for message_id, value in pairs:
        args += [message_id, value]
    return lua("offer")(keys=_offer_keys(keys), args=args)


def _scheduled(client: redis.Redis, keys: QueueKeys) -> list[tuple[bytes, float]]:
    return client.zrange(keys.timeout_zset, 0, -1, withscores=True)


# -- rel / abs: the normal path ------------------------------------------------------


def test_offer_rel_schedules_on_the_server_clock_and_announces_the_new_head(
    lua: Lua,
    keys: QueueKeys,
    redis_client: redis.Redis,
    server_ms: Callable[[], int],
    announced: Callable[[], list[bytes]],
) -> None:
    sort_key = next_sort_key()
    before = server_ms()
    [due] = _offer(lua, keys, "rel", _entry(5_000, sort_key, "m1", b'{"a":1}'))
    assert before + 5_000 <= due <= server_ms() + 5_000
    member = (sort_key + "m1").encode()
    assert _scheduled(redis_client, keys) == [(member, float(due))]
    assert redis_client.lrange(keys.backup_list, 0, -1) == [member]
    assert redis_client.hgetall(keys.payloads) == {b"m1": sort_key.encode() + b'{"a":1}'}
    assert announced() == [str(due).encode()]
    # A plain offer touches no dedupe index.
    assert redis_client.exists(keys.dedupe, keys.keyed, keys.holds, keys.throttle_copies) == 0


def test_offer_abs_schedules_at_the_given_epoch_ms(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis, announced: Callable[[], list[bytes]]
) -> None:
    sort_key = next_sort_key()
    assert _offer(lua, keys, "abs", _entry(FAR, sort_key, "m1")) == [FAR]
    assert _scheduled(redis_client, keys) == [((sort_key + "m1").encode(), float(FAR))]
    assert announced() == [str(FAR).encode()]


def test_offer_of_many_entries_due_in_one_millisecond_keeps_offer_order(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis, announced: Callable[[], list[bytes]]
) -> None:
    # Message ids that sort the other way round: the sort keys give offer order.
    sort_keys = next_sort_keys(3)
    entries = [_entry(FAR, sort_key, message_id) for sort_key, message_id in zip(sort_keys, "zyx", strict=True)]
    assert _offer(lua, keys, "abs", *entries) == [FAR, FAR, FAR]
    members = [(sort_key + message_id).encode() for sort_key, message_id in zip(sort_keys, "zyx", strict=True)]
    assert redis_client.zrange(keys.timeout_zset, 0, -1) == members
    assert redis_client.lrange(keys.backup_list, 0, -1) == members
    assert announced() == [str(FAR).encode()]  # once per call


def test_offer_behind_an_earlier_head_announces_nothing(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis, announced: Callable[[], list[bytes]]
) -> None:
    _offer(lua, keys, "abs", _entry(FAR, next_sort_key(), "m1"))
    assert announced() == [str(FAR).encode()]
    _offer(lua, keys, "abs", _entry(FAR + 1_000, next_sort_key(), "m2"))
    assert announced() == []
    _offer(lua, keys, "abs", _entry(FAR - 1_000, next_sort_key(), "m3"))
    assert announced() == [str(FAR - 1_000).encode()]


def test_offer_of_a_scheduled_id_under_a_new_member_reschedules_it(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    old_key, new_key = next_sort_keys(2)
    _offer(lua, keys, "abs", _entry(FAR, old_key, "m1", b"old"))
    assert _offer(lua, keys, "abs", _entry(FAR + 5, new_key, "m1", b"new")) == [FAR + 5]
    old, new = (old_key + "m1").encode(), (new_key + "m1").encode()
    assert _scheduled(redis_client, keys) == [(new, float(FAR + 5))]
    # The old member stays in the backup list (transfer trims it); the new one is appended.
    assert redis_client.lrange(keys.backup_list, 0, -1) == [old, new]
    assert redis_client.hgetall(keys.payloads) == {b"m1": new_key.encode() + b"new"}


def test_offer_of_the_same_member_again_moves_its_due_time_and_keeps_it_once(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    sort_key = next_sort_key()
    _offer(lua, keys, "abs", _entry(FAR, sort_key, "m1"))
    assert _offer(lua, keys, "abs", _entry(FAR - 10, sort_key, "m1")) == [FAR - 10]
    member = (sort_key + "m1").encode()
    assert _scheduled(redis_client, keys) == [(member, float(FAR - 10))]
    assert redis_client.lrange(keys.backup_list, 0, -1) == [member]
    assert redis_client.hlen(keys.payloads) == 1


def test_offer_of_one_id_twice_in_a_call_keeps_the_last(lua: Lua, keys: QueueKeys, redis_client: redis.Redis) -> None:
    first_key, last_key = next_sort_keys(2)
    reply = _offer(lua, keys, "abs", _entry(FAR, first_key, "m1", b"first"), _entry(FAR + 1, last_key, "m1", b"last"))
    assert reply == [FAR, FAR + 1]
    assert _scheduled(redis_client, keys) == [((last_key + "m1").encode(), float(FAR + 1))]
    assert redis_client.hgetall(keys.payloads) == {b"m1": last_key.encode() + b"last"}


@pytest.mark.parametrize("where", ["ready", "sent"])
def test_offer_of_a_member_that_already_came_due_returns_minus_2_and_writes_nothing(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis, announced: Callable[[], list[bytes]], where: str
) -> None:
    sort_key = next_sort_key()
    member = sort_key + "m1"
    if where == "ready":
        redis_client.hset(keys.ready_msgs, member, "{}")
    else:
        redis_client.zadd(keys.sent, {member: 1_000})
    state = snapshot(redis_client)
    other = next_sort_key()
    # In a call with another entry, that one is still scheduled.
    assert _offer(lua, keys, "rel", _entry(1_000, sort_key, "m1")) == [-2]
    assert snapshot(redis_client) == state
    assert announced() == []
    reply = _offer(lua, keys, "abs", _entry(FAR, sort_key, "m1"), _entry(FAR, other, "m2"))
    assert reply == [-2, FAR]
    assert redis_client.zrange(keys.timeout_zset, 0, -1) == [(other + "m2").encode()]


# -- legacy claims and "move:" -------------------------------------------------------


def test_offer_with_a_claim_moves_a_legacy_entry_still_listed(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    redis_client.rpush(keys.legacy_dq, "old-1", "old-2")
    redis_client.hset(keys.legacy_dq_msgs, mapping={"old-1": "one", "old-2": "two"})
    sort_key = next_sort_key()
    assert _offer(lua, keys, "abs", _entry(FAR, sort_key, "m1", b"one", claim="old-1")) == [FAR]
    assert redis_client.lrange(keys.legacy_dq, 0, -1) == [b"old-2"]
    assert redis_client.hgetall(keys.legacy_dq_msgs) == {b"old-2": b"two"}
    assert redis_client.zrange(keys.timeout_zset, 0, -1) == [(sort_key + "m1").encode()]


def test_offer_with_a_claim_no_longer_listed_returns_minus_1_and_writes_nothing(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis, announced: Callable[[], list[bytes]]
) -> None:
    redis_client.rpush(keys.legacy_dq, "old-2")
    state = snapshot(redis_client)
    assert _offer(lua, keys, "abs", _entry(FAR, next_sort_key(), "m1", claim="old-1")) == [-1]
    assert snapshot(redis_client) == state
    assert announced() == []


def test_offer_move_drops_the_in_flight_copy_then_schedules_like_rel(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis, server_ms: Callable[[], int]
) -> None:
    redis_client.hset(keys.ready_msgs, mapping={"g-in-flight": "copy", "g-other": "other"})
    sort_key = next_sort_key()
    before = server_ms()
    [due] = _offer(lua, keys, "move:g-in-flight", _entry(2_000, sort_key, "m1"))
    assert before + 2_000 <= due <= server_ms() + 2_000
    assert redis_client.hgetall(keys.ready_msgs) == {b"g-other": b"other"}
    assert _scheduled(redis_client, keys) == [((sort_key + "m1").encode(), float(due))]
    # Its copy already gone (acked meanwhile): scheduled all the same.
    assert _offer(lua, keys, "move:g-in-flight", _entry(2_000, next_sort_key(), "m2"))[0] > 0
    assert redis_client.zcard(keys.timeout_zset) == 2


# -- dedupe keys ---------------------------------------------------------------------


def test_offer_with_a_free_dedupe_key_takes_it(lua: Lua, keys: QueueKeys, redis_client: redis.Redis) -> None:
    _offer(lua, keys, "abs", _entry(FAR, next_sort_key(), "m1", key="report", mode="keep", ttl=30_000))
    assert redis_client.hgetall(keys.dedupe) == {b"report": b"m1"}
    assert redis_client.hgetall(keys.keyed) == {b"m1": b"30000:report"}


@pytest.mark.parametrize("mode", ["keep", "retry"])
def test_offer_keep_or_retry_of_a_held_key_returns_the_holder_and_writes_nothing(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis, announced: Callable[[], list[bytes]], mode: str
) -> None:
    holder_key = next_sort_key()
    _offer(lua, keys, "abs", _entry(FAR, holder_key, "m1", b"first", key="report", mode="keep"))
    announced()
    state = snapshot(redis_client)
    reply = _offer(lua, keys, "abs", _entry(FAR - 5, next_sort_key(), "m2", b"second", key="report", mode=mode))
    assert reply == [[FAR, (holder_key + "m1").encode(), holder_key.encode() + b"first"]]
    assert snapshot(redis_client) == state
    assert announced() == []


def test_offer_replace_of_a_held_key_cancels_the_holder_and_takes_the_key(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    first_key, second_key = next_sort_keys(2)
    _offer(lua, keys, "abs", _entry(FAR, first_key, "m1", key="report", mode="replace", ttl=10))
    assert _offer(lua, keys, "abs", _entry(FAR + 5, second_key, "m2", key="report", mode="replace", ttl=20)) == [
        FAR + 5
    ]
    assert _scheduled(redis_client, keys) == [((second_key + "m2").encode(), float(FAR + 5))]
    assert list(redis_client.hgetall(keys.payloads)) == [b"m2"]
    assert redis_client.hgetall(keys.dedupe) == {b"report": b"m2"}
    assert redis_client.hgetall(keys.keyed) == {b"m2": b"20:report"}


def test_offer_keep_by_the_message_that_holds_the_key_returns_it_and_replace_reschedules_it(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    sort_key = next_sort_key()
    member = (sort_key + "m1").encode()
    _offer(lua, keys, "abs", _entry(FAR, sort_key, "m1", b"v1", key="report", mode="keep", ttl=10))
    state = snapshot(redis_client)
    reply = _offer(lua, keys, "abs", _entry(FAR + 1, sort_key, "m1", b"v2", key="report", mode="keep", ttl=10))
    assert reply == [[FAR, member, sort_key.encode() + b"v1"]]
    assert snapshot(redis_client) == state
    for mode, due in (("replace", FAR + 2), ("retry", FAR + 3)):
        assert _offer(lua, keys, "abs", _entry(due, sort_key, "m1", b"v2", key="report", mode=mode, ttl=10)) == [due]
        assert _scheduled(redis_client, keys) == [(member, float(due))]
        assert redis_client.hgetall(keys.dedupe) == {b"report": b"m1"}
        assert redis_client.hgetall(keys.keyed) == {b"m1": b"10:report"}
    assert redis_client.hgetall(keys.payloads) == {b"m1": sort_key.encode() + b"v2"}


@pytest.mark.parametrize("mode", ["keep", "replace"])
def test_offer_in_a_throttle_window_returns_minus_3_with_the_moved_message_and_writes_nothing(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis, announced: Callable[[], list[bytes]], mode: str
) -> None:
    redis_client.zadd(keys.holds, {"report": FAR})
    redis_client.hset(keys.throttle_copies, "report", b'{"ran":1}')
    state = snapshot(redis_client)
    reply = _offer(lua, keys, "rel", _entry(1_000, next_sort_key(), "m1", key="report", mode=mode, ttl=10))
    assert reply == [[-3, b"", b'{"ran":1}']]
    assert snapshot(redis_client) == state
    assert announced() == []


def test_offer_retry_in_a_throttle_window_is_scheduled_and_ends_the_window(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    redis_client.zadd(keys.holds, {"report": FAR, "other": FAR})
    redis_client.hset(keys.throttle_copies, mapping={"report": "ran", "other": "ran"})
    sort_key = next_sort_key()
    assert _offer(lua, keys, "abs", _entry(FAR, sort_key, "m1", key="report", mode="retry", ttl=10)) == [FAR]
    assert redis_client.zrange(keys.timeout_zset, 0, -1) == [(sort_key + "m1").encode()]
    assert redis_client.zrange(keys.holds, 0, -1) == [b"other"]
    assert redis_client.hgetall(keys.throttle_copies) == {b"other": b"ran"}
    assert redis_client.hgetall(keys.dedupe) == {b"report": b"m1"}
    assert redis_client.hgetall(keys.keyed) == {b"m1": b"10:report"}


def test_offer_after_a_throttle_window_ended_takes_the_key_and_drops_the_window(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis, server_ms: Callable[[], int]
) -> None:
    redis_client.zadd(keys.holds, {"report": server_ms() - 1})
    redis_client.hset(keys.throttle_copies, "report", "ran")
    assert _offer(lua, keys, "abs", _entry(FAR, next_sort_key(), "m1", key="report", mode="keep", ttl=10)) == [FAR]
    assert redis_client.exists(keys.holds, keys.throttle_copies) == 0
    assert redis_client.hgetall(keys.dedupe) == {b"report": b"m1"}


def test_offer_of_a_key_whose_holder_is_no_longer_scheduled_takes_it(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    redis_client.hset(keys.dedupe, "report", "ghost")  # stale: "ghost" has no payload
    assert _offer(lua, keys, "abs", _entry(FAR, next_sort_key(), "m1", key="report", mode="keep")) == [FAR]
    assert redis_client.hgetall(keys.dedupe) == {b"report": b"m1"}


def test_offer_of_a_keyed_message_without_its_key_or_with_another_releases_the_key(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    sort_key = next_sort_key()
    _offer(lua, keys, "abs", _entry(FAR, sort_key, "m1", key="report", mode="keep", ttl=5))
    _offer(lua, keys, "abs", _entry(FAR, sort_key, "m1", key="digest", mode="keep", ttl=7))
    assert redis_client.hgetall(keys.dedupe) == {b"digest": b"m1"}
    assert redis_client.hgetall(keys.keyed) == {b"m1": b"7:digest"}
    _offer(lua, keys, "abs", _entry(FAR, sort_key, "m1"))
    assert redis_client.exists(keys.dedupe, keys.keyed) == 0
    assert redis_client.zcard(keys.timeout_zset) == 1


def test_offer_with_a_dedupe_index_of_the_wrong_type_fails_before_any_write(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    redis_client.set(keys.keyed, "not a hash")
    with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
        _offer(lua, keys, "abs", _entry(FAR, next_sort_key(), "m1", key="report", mode="keep"))
    assert redis_client.exists(keys.timeout_zset, keys.backup_list, keys.payloads, keys.dedupe) == 0


def test_offer_with_a_backup_list_of_the_wrong_type_fails_before_any_write(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    redis_client.set(keys.backup_list, "not a list")
    with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
        _offer(lua, keys, "rel", _entry(1_000, next_sort_key(), "m1"))
    assert redis_client.exists(keys.timeout_zset, keys.payloads) == 0


# -- bulk ----------------------------------------------------------------------------


def test_offer_bulk_schedules_every_entry_at_one_due_time_in_offer_order(
    lua: Lua,
    keys: QueueKeys,
    redis_client: redis.Redis,
    server_ms: Callable[[], int],
    announced: Callable[[], list[bytes]],
) -> None:
    sort_keys = next_sort_keys(3)
    pairs = [(message_id, sort_key.encode() + b"data") for sort_key, message_id in zip(sort_keys, "zyx", strict=True)]
    before = server_ms()
    count, due = _bulk(lua, keys, 3_000, pairs)
    assert count == 3
    assert before + 3_000 <= due <= server_ms() + 3_000
    members = [(sort_key + message_id).encode() for sort_key, message_id in zip(sort_keys, "zyx", strict=True)]
    assert _scheduled(redis_client, keys) == [(member, float(due)) for member in members]
    assert redis_client.lrange(keys.backup_list, 0, -1) == members
    assert redis_client.hgetall(keys.payloads) == {message_id.encode(): value for message_id, value in pairs}
    assert announced() == [str(due).encode()]


def test_offer_bulk_reschedules_ids_already_scheduled_and_keeps_the_last_of_a_repeated_id(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    old_key, same_key, mid_key, first_key, last_key = next_sort_keys(5)
    _offer(lua, keys, "abs", _entry(FAR, old_key, "old"), _entry(FAR, same_key, "same"))
    pairs = [
        ("old", mid_key.encode() + b"mid"),  # superseded within the call by the next entry of "old"
        ("same", same_key.encode() + b"again"),  # the same member: its due time moves
        ("old", last_key.encode() + b"last"),
        ("new", first_key.encode() + b"new"),
    ]
    count, due = _bulk(lua, keys, 1_000, pairs)
    assert count == 4
    assert dict(_scheduled(redis_client, keys)) == {
        (last_key + "old").encode(): float(due),
        (same_key + "same").encode(): float(due),
        (first_key + "new").encode(): float(due),
    }
    assert redis_client.hgetall(keys.payloads) == {
        b"old": last_key.encode() + b"last",
        b"same": same_key.encode() + b"again",
        b"new": first_key.encode() + b"new",
    }
    # Each new member is appended once; the same member is not appended again.
    assert redis_client.lrange(keys.backup_list, 0, -1) == [
        (old_key + "old").encode(),
        (same_key + "same").encode(),
        (last_key + "old").encode(),
        (first_key + "new").encode(),
    ]


def test_offer_bulk_of_a_keyed_message_releases_its_key(lua: Lua, keys: QueueKeys, redis_client: redis.Redis) -> None:
    sort_key = next_sort_key()
    _offer(lua, keys, "abs", _entry(FAR, sort_key, "m1", key="report", mode="keep", ttl=5))
    _bulk(lua, keys, 1_000, [("m1", sort_key.encode() + b"{}")])
    assert redis_client.exists(keys.dedupe, keys.keyed) == 0
    assert redis_client.zcard(keys.timeout_zset) == 1


# -- lanes (flow control) ---------------------------------------------------------------


def _flow_keys(keys: QueueKeys) -> list[str]:
    return [*_offer_keys(keys), keys.lane_of, keys.flow_flag]


def _offer_laned(lua: Lua, keys: QueueKeys, *entries: tuple[Sequence[Any], str]) -> Any:
    args: list[Any] = ["rel"]
    for entry, lane in entries:
        args += [*entry, lane]
    return lua("offer")(keys=_flow_keys(keys), args=args)


def test_a_laned_offer_records_its_lane_and_turns_flow_on(lua: Lua, keys: QueueKeys, redis_client: redis.Redis) -> None:
    redis_client.rpush(keys.ready, "waiting")
    lane = lane_id(4, "acme")
    _offer_laned(lua, keys, (_entry(60_000, next_sort_key(), "m1"), lane), (_entry(60_000, next_sort_key(), "m2"), ""))
    assert redis_client.hgetall(keys.lane_of) == {b"m1": lane.encode()}
    assert redis_client.get(keys.flow_flag) == b"1"  # (the flow HASH holds only limits and counts)
    assert redis_client.exists(keys.flow) == 0
    # the waiting ready queue is left as it is (a fetch through lanes takes it in turn)
    assert redis_client.lrange(keys.ready, 0, -1) == [b"waiting"]
    assert redis_client.exists(keys.ring(0), keys.levels) == 0
    assert redis_client.zcard(keys.timeout_zset) == 2


def test_plain_offers_with_the_flow_keys_write_no_lane_and_leave_flow_off(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    redis_client.rpush(keys.ready, "waiting")
    _offer_laned(lua, keys, (_entry(60_000, next_sort_key(), "m1"), ""), (_entry(60_000, next_sort_key(), "m2"), "0:"))
    assert redis_client.exists(keys.lane_of, keys.flow, keys.flow_flag, keys.levels, keys.ring(0)) == 0


def test_a_message_rescheduled_without_its_lane_loses_the_record_and_one_given_a_lane_gains_it(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    lane = lane_id(2, None)
    _offer_laned(lua, keys, (_entry(60_000, next_sort_key(), "m1"), lane))
    _offer_laned(lua, keys, (_entry(60_000, next_sort_key(), "m1"), ""))
    assert redis_client.exists(keys.lane_of) == 0
    _offer_laned(lua, keys, (_entry(60_000, next_sort_key(), "m1"), lane))
    assert redis_client.hgetall(keys.lane_of) == {b"m1": lane.encode()}


def test_a_replaced_key_holder_loses_its_lane_record(lua: Lua, keys: QueueKeys, redis_client: redis.Redis) -> None:
    lane = lane_id(1, "t")
    _offer_laned(lua, keys, (_entry(60_000, next_sort_key(), "old", key="k", mode="replace"), lane))
    _offer_laned(lua, keys, (_entry(60_000, next_sort_key(), "new", key="k", mode="replace"), lane))
    assert redis_client.hgetall(keys.lane_of) == {b"new": lane.encode()}


def test_a_bulk_offer_records_the_lanes_given_in_its_triples(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    lane = lane_id(3, "g")
    sort_a, sort_b = next_sort_keys(2)
    reply = lua("offer")(
        keys=_flow_keys(keys),
        args=["bulk", 60_000, "a", sort_a + "{}", lane, "b", sort_b + "{}", ""],
    )
    assert reply[0] == 2
    assert redis_client.hgetall(keys.lane_of) == {b"a": lane.encode()}
    assert redis_client.hgetall(keys.payloads) == {b"a": (sort_a + "{}").encode(), b"b": (sort_b + "{}").encode()}
    assert redis_client.get(keys.flow_flag) == b"1"
