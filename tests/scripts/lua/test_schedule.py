"""schedule.lua: change or read a periodic actor's schedule atomically. A schedule is a chain
of delayed messages, one tick of it scheduled at a time; the script starts (guarded),
extends, pauses, removes, checks one schedule, or sweeps all of a queue's schedules."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pytest
import redis

from dramatiq_redisson._ids import sort_key_at
from dramatiq_redisson._keys import QueueKeys

from .state import Lua, Script, fetch_ids, snapshot, turn_flow_on

NAME = "nightly"
DEFINITION = '{"actor":"report","spec":{"every":60000},"version":1}'
T0 = 1_700_000_000_000


def _keys(keys: QueueKeys) -> list[str]:
    """schedule.lua's KEYS, in the order of its header (and of scripts._calls.Scripts.schedule)."""
    return [
        *keys.schedule_keys,
        keys.timeout_zset,
        keys.backup_list,
        keys.payloads,
        keys.channel,
        keys.ready,
        keys.ready_msgs,
        keys.idle,
    ]


def _message_id(tick: int, name: str = NAME) -> str:
    return f"periodic:{name}:{tick}"


def _member(tick: int, name: str = NAME) -> str:
    return sort_key_at(tick) + _message_id(tick, name)


def _payload(tick: int) -> bytes:
    return sort_key_at(tick).encode() + b"\x1e{tick data}"


def _start_args(
    tick: int,
    *,
    guard: tuple[str, str] = ("def", ""),
    definition: str = DEFINITION,
    upcoming: str = "",
    ran: Sequence[Any] = (),
    name: str = NAME,
    overlap: str = "",
    limit: Any = "",
    ended: str = "",
    dropped: int = 0,
) -> list[Any]:
    return [
        "start",
        name,
        *guard,
        definition,
        _member(tick, name),
        _payload(tick),
        tick,
        upcoming,
        overlap,
        limit,
        ended,
        dropped,
        *ran,
    ]


@pytest.fixture
def schedule(lua: Lua, keys: QueueKeys) -> Callable[..., Any]:
    script = lua("schedule")
    return lambda *args: script(keys=_keys(keys), args=list(args))


# "start"


def test_start_of_a_new_schedule_stores_it_and_chains_its_first_tick(
    schedule: Script, keys: QueueKeys, redis_client: redis.Redis, listen: Callable[..., Any]
) -> None:
    published = listen(keys.channel)
    tick = T0 + 60_000
    assert schedule(*_start_args(tick, upcoming=f"{tick + 60_000},{tick + 120_000}")) == 1
    member = _member(tick)
    assert redis_client.hgetall(keys.schedules) == {NAME.encode(): DEFINITION.encode()}
    assert redis_client.hgetall(keys.chains) == {NAME.encode(): member.encode()}
    assert redis_client.zrange(keys.timeout_zset, 0, -1, withscores=True) == [(member.encode(), float(tick))]
    assert redis_client.lrange(keys.backup_list, 0, -1) == [member.encode()]
    assert redis_client.hgetall(keys.payloads) == {_message_id(tick).encode(): _payload(tick)}
    assert redis_client.hgetall(keys.schedule_state) == {
        f"{NAME}|t".encode(): f"{tick + 60_000},{tick + 120_000}".encode()
    }
    # The queue had nothing scheduled: the tick is its new head, announced.
    assert published() == [str(tick).encode()]
    # No missed tick ran: nothing ready.
    assert redis_client.exists(keys.ready, keys.ready_msgs) == 0


def test_start_announces_the_tick_only_when_it_is_the_new_earliest_due_time(
    schedule: Script, keys: QueueKeys, redis_client: redis.Redis, listen: Callable[..., Any]
) -> None:
    published = listen(keys.channel)
    redis_client.zadd(keys.timeout_zset, {"other": T0 + 5_000})
    assert schedule(*_start_args(T0 + 10_000)) == 1
    assert published() == []
    assert schedule(*_start_args(T0 + 1_000, guard=("def", DEFINITION), definition="")) == 1
    assert published() == [str(T0 + 1_000).encode()]


def test_start_replaces_the_tick_already_chained(schedule: Script, keys: QueueKeys, redis_client: redis.Redis) -> None:
    first, second = T0 + 60_000, T0 + 120_000
    assert schedule(*_start_args(first, upcoming="1,2")) == 1
    new_definition = DEFINITION.replace("60000", "120000")
    assert schedule(*_start_args(second, guard=("def", DEFINITION), definition=new_definition, upcoming="3")) == 1
    assert redis_client.hget(keys.schedules, NAME) == new_definition.encode()
    assert redis_client.hget(keys.chains, NAME) == _member(second).encode()
    # The old tick left the ZSET and the payload hash; its backup-list entry stays for
    # transfer.lua's upkeep to trim.
    assert redis_client.zrange(keys.timeout_zset, 0, -1, withscores=True) == [(_member(second).encode(), float(second))]
    assert redis_client.hgetall(keys.payloads) == {_message_id(second).encode(): _payload(second)}
    assert redis_client.lrange(keys.backup_list, 0, -1) == [_member(first).encode(), _member(second).encode()]
    assert redis_client.hget(keys.schedule_state, f"{NAME}|t") == b"3"


def test_start_with_an_empty_definition_keeps_the_stored_one(
    schedule: Script, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    assert schedule(*_start_args(T0)) == 1
    assert schedule(*_start_args(T0 + 1, guard=("def", DEFINITION), definition="")) == 1
    assert redis_client.hget(keys.schedules, NAME) == DEFINITION.encode()
    assert redis_client.hget(keys.chains, NAME) == _member(T0 + 1).encode()


@pytest.mark.parametrize(
    "guard",
    [
        ("def", "{}"),  # another definition is expected than the stored one
        ("def", ""),  # none is expected, one is stored
        ("stall", str(T0)),  # the chain is not waiting to be resumed
        ("paused", ""),  # the schedule is not paused
    ],
)
def test_start_whose_guard_fails_returns_0_and_writes_nothing(
    schedule: Script, keys: QueueKeys, redis_client: redis.Redis, listen: Callable[..., Any], guard: tuple[str, str]
) -> None:
    assert schedule(*_start_args(T0, upcoming="1,2")) == 1
    before = snapshot(redis_client)
    published = listen(keys.channel)
    assert schedule(*_start_args(T0 - 50_000, guard=guard, ran=[_member(T0 - 60_000), b"x"])) == 0
    assert snapshot(redis_client) == before
    assert published() == []


def test_start_with_a_def_guard_on_an_unknown_schedule_expects_the_empty_string(
    schedule: Script, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    assert schedule(*_start_args(T0, guard=("def", DEFINITION))) == 0
    assert redis_client.keys("*") == []


def test_start_guarded_by_the_stall_resumes_a_waiting_chain_and_clears_the_mark(
    schedule: Script, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    redis_client.hset(keys.schedules, NAME, DEFINITION)
    redis_client.hset(keys.schedule_state, f"{NAME}|s", str(T0))
    assert schedule(*_start_args(T0 + 1_000, guard=("stall", str(T0 - 1)), definition="")) == 0
    assert schedule(*_start_args(T0 + 1_000, guard=("stall", str(T0)), definition="", upcoming="7")) == 1
    assert redis_client.hgetall(keys.schedule_state) == {f"{NAME}|t".encode(): b"7"}
    assert redis_client.hget(keys.chains, NAME) == _member(T0 + 1_000).encode()


def test_start_of_a_paused_schedule_without_a_tick_stores_the_definition_and_stays_paused(
    schedule: Script, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    redis_client.hset(keys.schedules, NAME, DEFINITION)
    redis_client.hset(keys.schedule_state, mapping={f"{NAME}|p": "1", f"{NAME}|s": str(T0)})
    new_definition = DEFINITION.replace("report", "summary")
    assert schedule("start", NAME, "paused", "", new_definition, "", b"", "", "", "", "", "", 0) == 1
    assert redis_client.hget(keys.schedules, NAME) == new_definition.encode()
    # "|s" is cleared; "|p" stays (no tick); nothing is scheduled.
    assert redis_client.hgetall(keys.schedule_state) == {f"{NAME}|p".encode(): b"1"}
    assert redis_client.exists(keys.chains, keys.timeout_zset, keys.backup_list, keys.payloads) == 0


def test_start_of_a_paused_schedule_with_a_tick_resumes_it(
    schedule: Script, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    redis_client.hset(keys.schedules, NAME, DEFINITION)
    redis_client.hset(keys.schedule_state, mapping={f"{NAME}|p": "1", f"{NAME}|r": str(T0 - 60_000)})
    assert schedule(*_start_args(T0, guard=("paused", ""), definition="", upcoming="9")) == 1
    assert redis_client.hgetall(keys.schedule_state) == {
        f"{NAME}|r".encode(): str(T0 - 60_000).encode(),
        f"{NAME}|t".encode(): b"9",
    }
    assert redis_client.zscore(keys.timeout_zset, _member(T0)) == T0


def test_start_pushes_the_missed_ticks_that_run_now_and_records_the_latest_as_the_last_run(
    schedule: Script, keys: QueueKeys, redis_client: redis.Redis, server_ms: Callable[[], int]
) -> None:
    now = server_ms()
    missed = [now - 180_000, now - 120_000]
    ran: list[Any] = []
    for tick in missed:
        ran += [_member(tick), f"encoded {tick}".encode()]
    redis_client.rpush(keys.ready, "earlier")
    assert schedule(*_start_args(now + 60_000, ran=ran)) == 1
    after = server_ms()
    assert redis_client.lrange(keys.ready, 0, -1) == [b"earlier", *(_member(t).encode() for t in missed)]
    assert redis_client.hgetall(keys.ready_msgs) == {_member(t).encode(): f"encoded {t}".encode() for t in missed}
    state = redis_client.hgetall(keys.schedule_state)
    assert state[f"{NAME}|r".encode()] == str(missed[-1]).encode()
    lateness = int(state[f"{NAME}|l".encode()])
    assert now - missed[-1] <= lateness <= after - missed[-1]


def test_start_wakes_an_idle_consumer_for_the_ticks_it_pushes(
    schedule: Script, keys: QueueKeys, redis_client: redis.Redis, listen: Callable[..., Any]
) -> None:
    redis_client.zadd(keys.idle, {"tok-a": 4})
    woken = listen(keys.wake_channel("tok-a"))
    tick = T0 - 60_000
    assert schedule(*_start_args(T0, ran=[_member(tick), b"m"])) == 1
    assert woken() == [b"0"]
    assert redis_client.exists(keys.idle) == 0


def test_start_without_missed_ticks_wakes_nobody_and_records_no_run(
    schedule: Script, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    redis_client.zadd(keys.idle, {"tok-a": 4})
    assert schedule(*_start_args(T0)) == 1
    assert redis_client.zrange(keys.idle, 0, -1, withscores=True) == [(b"tok-a", 4.0)]
    assert redis_client.hget(keys.schedule_state, f"{NAME}|r") is None
    assert redis_client.hget(keys.schedule_state, f"{NAME}|l") is None


@pytest.mark.parametrize("wrong", ["backup_list", "payloads", "ready", "ready_msgs", "idle"])
def test_start_on_a_key_of_the_wrong_type_fails_with_nothing_written(
    schedule: Script, keys: QueueKeys, redis_client: redis.Redis, wrong: str
) -> None:
    assert schedule(*_start_args(T0, upcoming="1")) == 1
    redis_client.set(getattr(keys, wrong), "not the right type")
    before = snapshot(redis_client)
    with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
        schedule(*_start_args(T0 + 1, guard=("def", DEFINITION), ran=[_member(T0 - 1), b"m"]))
    assert snapshot(redis_client) == before


def test_start_with_a_due_time_that_is_not_a_number_fails_with_nothing_written(
    schedule: Script, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    assert schedule(*_start_args(T0, upcoming="1")) == 1
    before = snapshot(redis_client)
    args = _start_args(T0 + 1, guard=("def", DEFINITION), definition="NEW")
    args[7] = "soon"
    with pytest.raises(redis.ResponseError, match="due time must be a number of ms, not soon"):
        schedule(*args)
    assert snapshot(redis_client) == before


# "extend"


def test_extend_appends_ticks_after_the_expected_last_one(
    schedule: Script, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    assert schedule(*_start_args(T0, upcoming="100,200")) == 1
    assert schedule("extend", NAME, "200", "300,400") == 1
    assert redis_client.hget(keys.schedule_state, f"{NAME}|t") == b"100,200,300,400"
    # Repeating the same extension finds another last tick: refused, unchanged.
    assert schedule("extend", NAME, "200", "300,400") == 0
    assert redis_client.hget(keys.schedule_state, f"{NAME}|t") == b"100,200,300,400"


def test_extend_of_an_empty_list_expects_the_empty_string(
    schedule: Script, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    assert schedule(*_start_args(T0, upcoming="")) == 1
    assert schedule("extend", NAME, "100", "300") == 0
    assert schedule("extend", NAME, "", "300,400") == 1
    assert redis_client.hget(keys.schedule_state, f"{NAME}|t") == b"300,400"


def test_extend_of_a_chain_not_scheduled_returns_0_and_writes_nothing(
    schedule: Script, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    redis_client.hset(keys.schedules, NAME, DEFINITION)
    redis_client.hset(keys.schedule_state, f"{NAME}|t", "100,200")
    before = snapshot(redis_client)
    assert schedule("extend", NAME, "200", "300") == 0
    assert schedule("extend", "unknown", "", "300") == 0
    assert snapshot(redis_client) == before


# "pause"


def test_pause_unschedules_the_tick_and_marks_the_schedule_paused(
    schedule: Script, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    assert schedule(*_start_args(T0, upcoming="1,2")) == 1
    redis_client.hset(keys.schedule_state, mapping={f"{NAME}|s": "5", f"{NAME}|r": "4"})
    redis_client.zadd(keys.timeout_zset, {"other": T0})
    redis_client.hset(keys.payloads, "other-id", "x")
    assert schedule("pause", NAME) == 1
    assert redis_client.zrange(keys.timeout_zset, 0, -1) == [b"other"]
    assert redis_client.hgetall(keys.payloads) == {b"other-id": b"x"}
    assert redis_client.exists(keys.chains) == 0
    assert redis_client.hgetall(keys.schedule_state) == {
        f"{NAME}|t".encode(): b"1,2",
        f"{NAME}|r".encode(): b"4",
        f"{NAME}|p".encode(): b"1",
    }
    assert redis_client.hget(keys.schedules, NAME) == DEFINITION.encode()


def test_pause_of_a_paused_or_unknown_schedule_returns_0_and_writes_nothing(
    schedule: Script, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    assert schedule(*_start_args(T0)) == 1
    assert schedule("pause", NAME) == 1
    before = snapshot(redis_client)
    assert schedule("pause", NAME) == 0
    assert schedule("pause", "unknown") == 0
    assert snapshot(redis_client) == before


def test_pause_on_a_zset_of_the_wrong_type_fails_with_nothing_written(
    schedule: Script, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    redis_client.hset(keys.schedules, NAME, DEFINITION)
    redis_client.set(keys.timeout_zset, "not a zset")
    before = snapshot(redis_client)
    with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
        schedule("pause", NAME)
    assert snapshot(redis_client) == before


# "remove"


def test_remove_unschedules_the_tick_and_forgets_the_schedule_alone(
    schedule: Script, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    assert schedule(*_start_args(T0, upcoming="1")) == 1
    assert schedule(*_start_args(T0 + 5, name="other", upcoming="2")) == 1
    redis_client.hset(keys.schedule_state, mapping={f"{NAME}|r": "1", f"{NAME}|l": "2", f"{NAME}|s": "3"})
    assert schedule("remove", NAME) == 1
    assert redis_client.hgetall(keys.schedules) == {b"other": DEFINITION.encode()}
    assert redis_client.hgetall(keys.chains) == {b"other": _member(T0 + 5, "other").encode()}
    assert redis_client.zrange(keys.timeout_zset, 0, -1) == [_member(T0 + 5, "other").encode()]
    assert redis_client.hkeys(keys.payloads) == [_message_id(T0 + 5, "other").encode()]
    assert redis_client.hgetall(keys.schedule_state) == {b"other|t": b"2"}


def test_remove_of_a_paused_schedule_clears_its_pause_mark(
    schedule: Script, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    assert schedule(*_start_args(T0)) == 1
    assert schedule("pause", NAME) == 1
    assert schedule("remove", NAME) == 1
    assert redis_client.exists(keys.schedules, keys.chains, keys.schedule_state, keys.timeout_zset) == 0


def test_remove_of_an_unknown_schedule_returns_0_and_writes_nothing(
    schedule: Script, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    assert schedule(*_start_args(T0, upcoming="1")) == 1
    assert schedule("remove", NAME) == 1
    before = snapshot(redis_client)
    assert schedule("remove", NAME) == 0
    assert snapshot(redis_client) == before


# "check"


def test_check_reads_a_healthy_schedule_without_writing(
    schedule: Script, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    assert schedule(*_start_args(T0, upcoming="1,2")) == 1
    before = snapshot(redis_client)
    assert schedule("check", NAME, T0 + 5) == [DEFINITION.encode(), b"", b"", b"1,2", _member(T0).encode(), b""]
    assert snapshot(redis_client) == before


def test_check_of_an_unknown_schedule_reads_false_and_empty_fields(
    schedule: Script, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    assert schedule("check", "unknown", T0) == [None, b"", b"", b"", b"", b""]
    assert redis_client.keys("*") == []


def test_check_marks_a_chain_whose_tick_was_cancelled_waiting_from_after_its_last_run(
    schedule: Script, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    assert schedule(*_start_args(T0, upcoming="1,2")) == 1
    redis_client.hset(keys.schedule_state, f"{NAME}|r", str(T0 - 60_000))
    redis_client.zrem(keys.timeout_zset, _member(T0))  # an operator cancelled it
    got = schedule("check", NAME, T0 + 999)
    assert got == [DEFINITION.encode(), str(T0 - 60_000 + 1).encode(), b"", b"1,2", b"", b""]
    assert redis_client.exists(keys.chains) == 0
    assert redis_client.hget(keys.schedule_state, f"{NAME}|s") == str(T0 - 59_999).encode()
    # Checked again: it waits already; nothing changes.
    before = snapshot(redis_client)
    assert schedule("check", NAME, T0 + 2_000) == got
    assert snapshot(redis_client) == before


def test_check_marks_a_broken_chain_that_never_ran_waiting_from_the_time_given(
    schedule: Script, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    assert schedule(*_start_args(T0)) == 1
    redis_client.delete(keys.timeout_zset)  # cleared by an operator
    assert schedule("check", NAME, T0 + 123) == [DEFINITION.encode(), str(T0 + 123).encode(), b"", b"", b"", b""]
    assert redis_client.hget(keys.schedule_state, f"{NAME}|s") == str(T0 + 123).encode()


def test_check_leaves_a_paused_schedule_as_it_is(schedule: Script, keys: QueueKeys, redis_client: redis.Redis) -> None:
    assert schedule(*_start_args(T0)) == 1
    assert schedule("pause", NAME) == 1
    before = snapshot(redis_client)
    assert schedule("check", NAME, T0 + 5) == [DEFINITION.encode(), b"", b"1", b"", b"", b""]
    assert snapshot(redis_client) == before


# "sweep"


def test_sweep_lists_the_schedules_that_need_attention_and_marks_the_broken_ones(
    schedule: Script, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    full = "1,2,3"
    assert schedule(*_start_args(T0, name="healthy", upcoming=full)) == 1
    assert schedule(*_start_args(T0, name="short", upcoming="1")) == 1
    assert schedule(*_start_args(T0, name="broken", upcoming=full)) == 1
    assert schedule(*_start_args(T0, name="paused", upcoming="")) == 1
    assert schedule("pause", "paused") == 1
    redis_client.hset(keys.schedules, "waiting", DEFINITION)
    redis_client.hset(keys.schedule_state, mapping={"waiting|s": "77", "waiting|t": full, "broken|r": "41"})
    redis_client.zrem(keys.timeout_zset, _member(T0, "broken"))

    found = schedule("sweep", "", T0 + 10, 3)
    assert sorted(found) == [b"broken", b"short", b"waiting"]
    assert redis_client.hget(keys.schedule_state, "broken|s") == b"42"
    assert redis_client.hexists(keys.chains, "broken") is False
    assert redis_client.hget(keys.schedule_state, "waiting|s") == b"77"
    assert redis_client.hexists(keys.chains, "healthy") is True
    assert redis_client.hget(keys.schedule_state, "paused|s") is None


def test_sweep_with_a_lower_low_water_mark_skips_the_short_lists(
    schedule: Script, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    assert schedule(*_start_args(T0, name="short", upcoming="1")) == 1
    assert schedule(*_start_args(T0, name="empty", upcoming="")) == 1
    assert schedule("sweep", "", T0, 1) == [b"empty"]
    assert schedule("sweep", "", T0, 0) == []


def test_sweep_of_a_queue_without_schedules_returns_nothing(schedule: Script, redis_client: redis.Redis) -> None:
    assert schedule("sweep", "", T0, 3) == []
    assert redis_client.keys("*") == []


# Validation


def test_an_unknown_operation_is_refused_with_nothing_written(
    schedule: Script, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    assert schedule(*_start_args(T0, upcoming="1")) == 1
    before = snapshot(redis_client)
    with pytest.raises(redis.ResponseError, match="schedule: unknown operation resume"):
        schedule("resume", NAME)
    assert snapshot(redis_client) == before


def test_with_flow_on_ticks_run_now_go_to_the_ready_queue_and_a_fetch_through_lanes_takes_them(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis, server_ms: Callable[[], int]
) -> None:
    turn_flow_on(redis_client, keys)
    now = server_ms()
    ran: list[Any] = [_member(now - 60_000), b"encoded"]
    assert lua("schedule")(keys=_keys(keys), args=_start_args(now + 60_000, ran=ran)) == 1
    assert redis_client.lrange(keys.ready, 0, -1) == [_member(now - 60_000).encode()]
    assert redis_client.exists(keys.ring(0), keys.levels) == 0
    assert fetch_ids(lua, keys, 5, now) == [_member(now - 60_000).encode()]


# Policies (issue 50): overlap, limit, window end, dropped ticks, the start deadline


def test_start_with_overlap_skip_runs_only_the_first_missed_tick_and_counts_the_others(
    schedule: Script, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    missed = [T0 - 3_000, T0 - 2_000, T0 - 1_000]
    ran = [x for t in missed for x in (_member(t), b"m")]
    assert schedule(*_start_args(T0 + 1_000, ran=ran, overlap="skip")) == 1
    assert redis_client.lrange(keys.ready, 0, -1) == [_member(missed[0]).encode()]
    state = redis_client.hgetall(keys.schedule_state)
    assert (state[f"{NAME}|o".encode()], state[f"{NAME}|k".encode()], state[f"{NAME}|n".encode()]) == (
        b"skip",
        b"2",
        b"1",
    )
    assert state[f"{NAME}|u".encode()] == _member(missed[0]).encode()


def test_start_with_overlap_skip_runs_nothing_while_the_current_run_is_in_flight(
    schedule: Script, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    assert schedule(*_start_args(T0, overlap="skip")) == 1
    redis_client.hset(keys.schedule_state, f"{NAME}|u", "running-one")
    redis_client.hset(keys.ready_msgs, "running-one", "{}")
    guard = ("def", DEFINITION)
    assert schedule(*_start_args(T0 + 1_000, guard=guard, ran=[_member(T0 - 1_000), b"m"], overlap="skip")) == 1
    assert redis_client.lrange(keys.ready, 0, -1) == []
    assert redis_client.hget(keys.schedule_state, f"{NAME}|k") == b"1"
    assert redis_client.hget(keys.chains, NAME) == _member(T0 + 1_000).encode()  # the chain goes on


def test_start_with_a_limit_runs_the_runs_left_then_ends_the_schedule_with_nothing_chained(
    schedule: Script, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    redis_client.hset(keys.schedule_state, f"{NAME}|n", "1")
    ran = [x for t in (T0 - 2_000, T0 - 1_000) for x in (_member(t), b"m")]
    assert schedule(*_start_args(T0 + 1_000, ran=ran, limit=2)) == 2
    assert redis_client.lrange(keys.ready, 0, -1) == [_member(T0 - 2_000).encode()]
    assert redis_client.exists(keys.chains, keys.timeout_zset) == 0
    state = redis_client.hgetall(keys.schedule_state)
    assert (state[f"{NAME}|n".encode()], state[f"{NAME}|e".encode()], state[f"{NAME}|m".encode()]) == (
        b"2",
        b"limit",
        b"2",
    )
    # A new definition with a higher limit chains it again
    guard = ("def", DEFINITION)
    assert schedule(*_start_args(T0 + 2_000, guard=guard, definition='{"v":2}', limit=5)) == 1
    assert redis_client.hget(keys.chains, NAME) == _member(T0 + 2_000).encode()
    assert redis_client.hget(keys.schedule_state, f"{NAME}|e") is None


def test_start_past_the_windows_end_ends_the_schedule_and_the_sweep_passes_it_over(
    schedule: Script, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    args = _start_args(T0, ended="end", dropped=3)
    args[5:7] = ["", b""]  # no tick to chain
    assert schedule(*args) == 2
    assert redis_client.exists(keys.chains, keys.timeout_zset) == 0
    state = redis_client.hgetall(keys.schedule_state)
    assert (state[f"{NAME}|e".encode()], state[f"{NAME}|d".encode()]) == (b"end", b"3")
    before = snapshot(redis_client)
    assert schedule("sweep", "", T0 + 5, 3) == []
    assert schedule("check", NAME, T0 + 5)[1:] == [b"", b"", b"", b"", b"end"]
    assert snapshot(redis_client) == before


def test_begin_starts_a_tick_before_its_deadline_and_drops_one_after_it_counting_it(
    schedule: Script, keys: QueueKeys, redis_client: redis.Redis, server_ms: Callable[[], int]
) -> None:
    assert schedule(*_start_args(T0)) == 1
    now = server_ms()
    assert schedule("begin", NAME, now - 5_000, now + 60_000) == 1
    assert redis_client.hget(keys.schedule_state, f"{NAME}|g") == str(now - 5_000).encode()
    assert schedule("begin", NAME, now - 1_000, now - 10) == 0
    assert redis_client.hget(keys.schedule_state, f"{NAME}|d") == b"1"
    # A tick that started before (redelivered after its worker was killed) runs again
    assert schedule("begin", NAME, now - 5_000, now - 10) == 1
    assert redis_client.hget(keys.schedule_state, f"{NAME}|d") == b"1"


def test_begin_for_a_schedule_no_longer_stored_writes_nothing(
    schedule: Script, redis_client: redis.Redis, server_ms: Callable[[], int]
) -> None:
    now = server_ms()
    assert schedule("begin", "gone", now - 1_000, now - 10) == 0
    assert schedule("begin", "gone", now, now + 10_000) == 1
    assert redis_client.keys("*") == []


def test_remove_forgets_the_policy_fields_and_counts(
    schedule: Script, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    assert schedule(*_start_args(T0, overlap="skip", limit=9)) == 1
    redis_client.hset(keys.schedule_state, mapping={f"{NAME}|{f}": "1" for f in "unkdeg"})
    assert schedule("remove", NAME) == 1
    assert redis_client.exists(keys.schedule_state) == 0
