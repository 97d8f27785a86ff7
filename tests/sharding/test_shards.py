"""Where a sharded queue's shards go (_shards.py): against a slot map, each new shard on
the master with the fewest of the queue's shards, the same choice in every process, and
growing keeps the shards there are."""

from __future__ import annotations

import threading
from collections import Counter

import pytest

from dramatiq_redisson._queue_names import MAX_SHARDS, base_queue, shard_name
from dramatiq_redisson.sharding._consumer import _Freed
from dramatiq_redisson.sharding._shards import choose_suffixes, shard_slot, slot_owner

#: The split ``redis-cli --cluster create`` makes for three masters.
THREE = slot_owner([(0, 5460, "m1"), (5461, 10922, "m2"), (10923, 16383, "m3")])
FOUR = slot_owner([(0, 4095, "a"), (4096, 8191, "b"), (8192, 12287, "c"), (12288, 16383, "d")])


def _spread(queue: str, suffixes: list[int], owner: object) -> Counter[str]:
    assert callable(owner)
    return Counter(owner(shard_slot("dramatiq", queue, j)) for j in [0, *suffixes])


@pytest.mark.parametrize("queue", ["default", "emails", "reports", "bench", "a.b-c_d"])
def test_six_shards_on_three_masters_are_two_on_each(queue: str) -> None:
    suffixes = choose_suffixes("dramatiq", queue, [], 5, THREE)
    assert sorted(_spread(queue, suffixes, THREE).values()) == [2, 2, 2]
    assert len(set(suffixes)) == 5 and 0 not in suffixes


def test_fixed_suffixes_would_not_spread_evenly() -> None:
    """The reason for choosing: the first suffixes, as they come, are uneven for most names."""
    names = ("default", "emails", "reports", "bench")
    uneven = [q for q in names if sorted(_spread(q, [1, 2, 3, 4, 5], THREE).values()) != [2, 2, 2]]
    assert len(uneven) >= 3


def test_eight_shards_on_four_masters_and_growing_keeps_the_shards_there_are() -> None:
    first = choose_suffixes("dramatiq", "default", [], 7, FOUR)
    assert sorted(_spread("default", first, FOUR).values()) == [2, 2, 2, 2]
    more = choose_suffixes("dramatiq", "default", first, 4, FOUR)
    assert not set(more) & set(first)
    assert sorted(_spread("default", [*first, *more], FOUR).values()) == [3, 3, 3, 3]


def test_the_choice_is_the_same_in_every_process_and_the_shards_are_spread_over_the_slots() -> None:
    a = choose_suffixes("dramatiq", "default", [], 5, THREE)
    b = choose_suffixes("dramatiq", "default", [], 5, THREE)
    assert a == b
    slots = sorted(shard_slot("dramatiq", "default", j) for j in [0, *a])
    gaps = [(b - a) % 16384 for a, b in zip(slots, [*slots[1:], slots[0] + 16384], strict=True)]
    assert min(gaps) > 16384 // 6 // 4  # no two shards on neighbouring slots


def test_new_shards_fill_the_least_loaded_masters_first() -> None:
    # Given shards already on m1 only (say the cluster had one master when they were made)
    on_m1 = [j for j in range(1, 500) if THREE(shard_slot("dramatiq", "q", j)) == "m1"][:2]
    assert THREE(shard_slot("dramatiq", "q", 0)) in {"m1", "m2", "m3"}
    more = choose_suffixes("dramatiq", "q", on_m1, 3, THREE)
    spread = _spread("q", [*on_m1, *more], THREE)
    assert max(spread.values()) - min(spread.values()) <= 1


def test_one_server_spreads_over_the_slots_only() -> None:
    suffixes = choose_suffixes("dramatiq", "default", [], 3, lambda slot: "only")
    assert len(set(suffixes)) == 3


def test_names() -> None:
    assert shard_name("default", 0) == "default" and shard_name("default", 7) == "default~7"
    assert base_queue("default~7") == "default" and base_queue("default") == "default"


@pytest.mark.parametrize("count", [-1, MAX_SHARDS])
def test_too_many_or_a_negative_count_is_refused(count: int) -> None:
    with pytest.raises(ValueError, match="shards"):
        choose_suffixes("dramatiq", "default", [], count, THREE)


def test_plan_grows_takes_retired_shards_back_first_and_shrinks_by_retiring_the_last() -> None:
    from dramatiq_redisson.sharding._shards import Layout, plan

    first = plan("dramatiq", "q", None, 3, THREE)
    assert first.active[0] == 0 and len(first.active) == 3 and first.retired == ()
    fewer = plan("dramatiq", "q", first, 2, THREE)
    assert fewer == Layout(first.active[:2], first.active[2:])
    again = plan("dramatiq", "q", fewer, 4, THREE)
    assert again.active[:3] == first.active and len(again.active) == 4 and again.retired == ()
    assert plan("dramatiq", "q", again, 4, THREE) == again
    with pytest.raises(ValueError, match="shards"):
        plan("dramatiq", "q", None, 0, THREE)


def test_layouts_are_stored_once_and_every_process_ends_with_the_same(redis_url: str) -> None:
    import redis as redis_lib

    from dramatiq_redisson import RedissonBroker
    from dramatiq_redisson.sharding._shards import ShardLayouts

    broker = RedissonBroker(url=redis_url)
    try:
        layouts = [ShardLayouts(broker.redisson_scripts, broker.keys, lambda: THREE, 1000) for _ in range(2)]
        assert layouts[0].read("q") is None
        made = layouts[0].ensure("dramatiq", "q", 6)
        assert layouts[1].ensure("dramatiq", "q", 6) == made == layouts[1].read("q")
        assert sorted(_spread("q", list(made.active[1:]), THREE).values()) == [2, 2, 2]
        shrunk = layouts[1].ensure("dramatiq", "q", 2)
        assert shrunk.active == made.active[:2] and shrunk.retired == made.active[2:]
        assert layouts[0].read("q") == shrunk
        assert shrunk.names("q")[:2] == ["q", f"q~{made.active[1]}"]
        client = redis_lib.Redis.from_url(redis_url)
        assert client.hgetall(broker.keys("q").shards)[b"active"] == ",".join(map(str, shrunk.active)).encode()
    finally:
        broker.flush_all()
        broker.close()


def test_room_freed_in_one_shard_is_seen_by_every_shard_that_was_waiting_for_it() -> None:
    """A shard consumer that found the shared prefetch full waits for room; an ack in any
    shard must wake it, even when another shard cleared the signal meanwhile (a shared
    Event loses that wake-up: the shard then sleeps a worker timeout with room free)."""
    freed = _Freed()
    woke: dict[str, bool] = {}

    def shard(name: str, before_set: threading.Event, after_set: threading.Event) -> None:
        freed.clear()  # found the budget full
        before_set.set()
        after_set.wait(5)
        woke[name] = freed.wait(0.5)

    cleared_a, cleared_b, was_set = threading.Event(), threading.Event(), threading.Event()
    a = threading.Thread(target=shard, args=("a", cleared_a, was_set))
    a.start()
    cleared_a.wait(5)
    freed.set()  # an ack: room for one more
    # Shard b finds the budget full again only now, and clears: a must still wake.
    b = threading.Thread(target=shard, args=("b", cleared_b, was_set))
    b.start()
    cleared_b.wait(5)
    was_set.set()
    a.join(5)
    assert woke["a"] is True
    b.join(5)
    assert woke["b"] is False  # nothing freed after its own clear: it waits its timeout
