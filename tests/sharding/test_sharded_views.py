"""A sharded queue's views are a list of queues (issue 48): each holds one one-shard view
per shard, built on that shard's own keys, has no keys of its own, and folds every public
method of the one-shard view over its shards. A public method added to
:class:`DelayedQueue` or :class:`DeadLetters` and not folded would read one shard only:
these tests name it. On one server."""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from typing import Any

import dramatiq
import pytest
import redis
from dramatiq.middleware import default_middleware

from dramatiq_redisson import DeadLetters, DelayedQueue, RedissonBroker
from dramatiq_redisson.connection._topology import topology_for
from dramatiq_redisson.sharding._views import ShardedDeadLetters, ShardedDelayedQueue
from tests.helpers import wait_for

PAIRS = [(DelayedQueue, ShardedDelayedQueue), (DeadLetters, ShardedDeadLetters)]


def public_members(cls: type) -> set[str]:
    """The public methods and properties of ``cls``, inherited ones included."""
    return {name for name, _ in inspect.getmembers(cls) if not name.startswith("_")}


def not_folded(one: type, sharded: type) -> list[str]:
    """The public members of the one-shard view ``one`` that ``sharded`` does not define
    itself: inherited, they would run on keys a sharded view does not have."""
    own = {name for klass in sharded.__mro__ if klass not in one.__mro__ for name in vars(klass)}
    return sorted(public_members(one) - own)


@pytest.mark.parametrize(("one", "sharded"), PAIRS, ids=["delayed_queue", "dead_letters"])
def test_every_public_member_of_a_one_shard_view_is_folded_by_the_sharded_view(one: type, sharded: type) -> None:
    assert not_folded(one, sharded) == []
    # Same signatures, so that a caller cannot tell them apart.
    for name in public_members(one):
        ours, theirs = getattr(sharded, name), getattr(one, name)
        if callable(theirs):
            assert inspect.signature(ours) == inspect.signature(theirs), name


def test_a_public_method_added_to_a_one_shard_view_and_not_folded_is_named() -> None:
    class Grown(DelayedQueue):
        def oldest_due(self) -> int | None:
            return self.next_due()

    class GrownSharded(ShardedDelayedQueue, Grown):
        pass

    assert not_folded(Grown, GrownSharded) == ["oldest_due"]


@pytest.fixture
def sharded(redis_url: str) -> Iterator[RedissonBroker]:
    broker = RedissonBroker(url=redis_url, middleware=[m() for m in default_middleware], shards={"default": 3})
    dramatiq.set_broker(broker)
    yield broker
    broker.flush_all()
    broker.close()


def test_a_sharded_view_has_no_keys_of_its_own_and_one_view_per_shard_on_its_keys(sharded: RedissonBroker) -> None:
    @dramatiq.actor(max_retries=0)
    def job(i: int) -> None:
        pass

    for i in range(9):
        job.send_with_options(args=(i,), delay=600_000)
    names = sharded.shard_router.consumed("default")
    views: list[Any] = [sharded.delayed_queue("default"), sharded.dead_letters("default")]
    for view in views:
        assert isinstance(view, ShardedDelayedQueue | ShardedDeadLetters)
        assert not hasattr(view, "keys") and not hasattr(view, "broker")
        assert [shard.keys.queue_name for shard in view.shards] == names
        assert {shard.queue_name for shard in view.shards} == {view.queue_name} == {"default"}
    delayed = views[0]
    # Each shard holds some; the sharded view reads them all.
    assert [shard.size() for shard in delayed.shards] == [3, 3, 3]
    assert delayed.size() == 9 and len(delayed.read_all()) == 9


def test_dead_letters_entries_and_load_fold_over_the_shards(sharded: RedissonBroker) -> None:
    """The steps a sharded page is made of, public on the one-shard view, give the same
    as its page on the sharded one."""

    @dramatiq.actor(max_retries=0)
    def doomed(i: int) -> None:
        raise RuntimeError(i)

    ids = [doomed.send(i).message_id for i in range(6)]
    worker = dramatiq.Worker(sharded, worker_timeout=100, worker_threads=2)
    worker.start()
    dead = sharded.dead_letters("default")
    try:
        assert wait_for(lambda: dead.size() == 6, timeout=30)
    finally:
        worker.stop()
    assert isinstance(dead, ShardedDeadLetters)
    newest = dead.newest(0, 6)
    assert sorted(redis_id for redis_id, _ in newest) == sorted(ids)
    assert [died for _, died in newest] == sorted((died for _, died in newest), reverse=True)
    assert [m.message_id for _, m in dead.load(newest)] == [m.message_id for _, m in dead.page(0, 6)]
    assert dead.newest(2, 3) == newest[2:5]
    assert dead.oldest(2) == sorted(newest, key=lambda e: (e[1], e[0]))[:2]
    assert dead.existing([ids[0], "nope", ids[5]]) == [ids[0], ids[5]]
    assert dead.find(ids[0], limit=0)[0][1].message_id == ids[0]
    assert dead.find("nope", limit=0) == []


def test_the_slot_map_of_one_server_is_one_range(redis_client: redis.Redis) -> None:
    assert topology_for(redis_client).slot_ranges() == [(0, 16383, "server")]
