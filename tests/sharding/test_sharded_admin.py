"""A sharded queue's scheduled messages and dead letters as one queue's (issue 36,
docs/sharding-design.md): ``delayed_queue()`` and ``dead_letters()`` of a queue over four
shards list in one due order (paged across shards), find a message by id or a dedupe key
in whatever shard holds it, count and act over all shards, and requeue a dead letter to
its own shard; the CLI and the dashboard show each shard's counts. On one server."""

from __future__ import annotations

import datetime
import html
import itertools
import re
from collections.abc import Iterator
from typing import Any, cast

import dramatiq
import pytest
import redis
from dramatiq import Actor, Worker
from dramatiq.middleware import default_middleware

from dramatiq_redisson import RedissonBroker
from dramatiq_redisson._ids import message_id_of
from dramatiq_redisson.dashboard import make_app
from dramatiq_redisson.sharding._views import ShardedDeadLetters, ShardedDelayedQueue
from tests.cli.test_cli import Run, cli_runner, ok_json, two_actors
from tests.helpers import server_ms, wait_for
from tests.wsgi_client import Client


@pytest.fixture
def sharded(redis_url: str, redis_client: redis.Redis) -> Iterator[RedissonBroker]:
    broker = RedissonBroker(url=redis_url, middleware=[m() for m in default_middleware], shards={"default": 4})
    dramatiq.set_broker(broker)
    yield broker
    broker.flush_all()
    broker.close()


@pytest.fixture
def actors(sharded: RedissonBroker) -> tuple[Actor[..., None], Actor[..., None]]:
    return two_actors()


@pytest.fixture
def cli(redis_url: str) -> Run:
    return cli_runner(redis_url)


def _names(broker: RedissonBroker) -> list[str]:
    return broker.shard_router.consumed("default")


def _shard_of_scheduled(broker: RedissonBroker, message_id: str) -> list[str]:
    """The shards whose delayed queue holds ``message_id``."""
    return [n for n in _names(broker) if broker.client.hexists(broker.keys(n).payloads, message_id)]


def _expected_order(broker: RedissonBroker) -> list[str]:
    """Every scheduled message id of every shard in (due, member) order, from the ZSETs."""
    entries: list[tuple[float, bytes]] = []
    for name in _names(broker):
        zset = cast(
            "list[tuple[bytes, float]]", broker.client.zrange(broker.keys(name).timeout_zset, 0, -1, withscores=True)
        )
        entries += [(due, member) for member, due in zset]
    return [message_id_of(member) for _, member in sorted(entries)]


def _scramble(i: int) -> int:
    """A delay (ms) out of step with the round robin over the shards."""
    return 600_000 + (i * 7919) % 40_000


# -- the delayed queue ------------------------------------------------------------------


def test_listing_merges_the_shards_by_due_time_and_pages_across_them(
    sharded: RedissonBroker, actors: tuple[Actor[..., None], Actor[..., None]]
) -> None:
    alpha, beta = actors
    ids = [
        (alpha if i % 3 else beta)
        .send_with_options(args=(i,), kwargs={"tag": f"t{i % 5}"}, delay=_scramble(i))
        .message_id
        for i in range(41)
    ]
    # Spread over every shard (in turn)
    assert all(sum(1 for i in ids if name in _shard_of_scheduled(sharded, i)) >= 10 for name in _names(sharded))
    dq = sharded.delayed_queue("default")
    assert isinstance(dq, ShardedDelayedQueue) and dq.queue_name == "default"
    expected = _expected_order(sharded)
    assert sorted(expected) == sorted(ids)
    # read_all and scan: one due order over all shards; each message read back on its queue
    listed = dq.read_all()
    assert [m.message_id for _, m in listed] == expected
    assert [due for due, _ in listed] == sorted(due for due, _ in listed)
    assert {m.queue_name for _, m in listed} == {"default"}
    assert [m.message_id for _, m in dq.read_all(limit=5)] == expected[:5]
    assert [m.message_id for _, m in dq.scan(batch=3)] == expected
    assert [m.message_id for _, m in dq.scan(actor_name="beta", batch=2)] == [
        m.message_id for _, m in listed if m.actor_name == "beta"
    ]
    # page(): every message once, in order, across pages; each page reads each shard once,
    # for at most the page's size
    asked: list[int] = []
    for shard in dq.shards:

        def spy(size: int, cursor: Any, real: Any = shard._scan_page) -> Any:
            asked.append(size)
            return real(size, cursor)

        shard._scan_page = spy  # type: ignore[method-assign]
    paged: list[list[str]] = []
    cursor = None
    while True:
        asked.clear()
        page = dq.page(after=cursor, size=6)
        assert len(asked) == 4 and max(asked) <= 6
        paged.append([m.message_id for _, m in page.entries])
        if (cursor := page.cursor) is None:
            break
    assert [len(p) for p in paged] == [6, 6, 6, 6, 6, 6, 5]
    assert list(itertools.chain.from_iterable(paged)) == expected
    # A filtered page, paged on with its cursor
    tagged = [m.message_id for _, m in listed if m.kwargs["tag"] == "t2"]
    found: list[str] = []
    cursor = None
    while True:
        page = dq.page(after=cursor, size=2, match='"t2"', budget=10)
        found += [m.message_id for _, m in page.entries]
        if (cursor := page.cursor) is None:
            break
    assert found == tagged and len(tagged) >= 8
    with pytest.raises(ValueError, match="cursor"):
        dq.page(after="not-a-cursor")


def test_get_cancel_reschedule_and_promote_a_message_of_any_shard(
    sharded: RedissonBroker, actors: tuple[Actor[..., None], Actor[..., None]]
) -> None:
    alpha, _ = actors
    ids = [alpha.send_with_options(args=(i,), delay=600_000).message_id for i in range(8)]
    dq = sharded.delayed_queue("default")
    home = {i: _shard_of_scheduled(sharded, i) for i in ids}
    assert all(len(shards) == 1 for shards in home.values())
    one_per_shard = {shards[0]: i for i, shards in home.items()}
    assert len(one_per_shard) == 4
    now = server_ms(sharded.client)
    for shard, message_id in one_per_shard.items():
        # get / contains, in whatever shard
        found = dq.get(message_id)
        assert found is not None and found[1].message_id == message_id and found[1].queue_name == "default"
        assert message_id in dq and dq.contains(message_id)
        # reschedule: a delay, then a time; it stays in its shard
        assert dq.reschedule(message_id, delay=datetime.timedelta(minutes=20))
        due = dq.get(message_id)[0]  # type: ignore[index]
        assert now + 1_190_000 < due < now + 1_300_000
        at = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(hours=2)
        assert dq.reschedule(message_id, at=at)
        assert abs(dq.get(message_id)[0] - int(at.timestamp() * 1000)) < 5  # type: ignore[index]
        assert _shard_of_scheduled(sharded, message_id) == [shard]
    a, b, c, d = one_per_shard.values()
    # promote: due now (no consumer runs here to move it)
    assert dq.promote(a)
    assert dq.get(a)[0] <= server_ms(sharded.client)  # type: ignore[index]
    assert dq.count(due_before=server_ms(sharded.client) + 1) == 1
    # remove: gone, and a second time nothing
    assert dq.remove(b) and b not in dq and dq.get(b) is None and not dq.remove(b)
    # several at once, over shards
    assert dq.remove_many([c, d, "nope"]) == 2 and dq.size() == 5
    # An id no shard holds
    assert not dq.reschedule("nope", delay=1000) and not dq.promote("nope") and dq.get("nope") is None
    # Bad input: nothing changed
    with pytest.raises(TypeError):
        dq.reschedule(a, delay=1000, at=0)
    with pytest.raises(ValueError):
        dq.reschedule(a, at=datetime.datetime(2030, 1, 1))  # naive
    assert dq.size() == 5


def test_a_dedupe_key_is_found_in_its_shard_and_after_a_reshard_in_another(
    sharded: RedissonBroker, redis_url: str, actors: tuple[Actor[..., None], Actor[..., None]]
) -> None:
    alpha, _ = actors
    keys = [f"order:{i}" for i in range(16)]
    sent = {
        key: alpha.send_with_options(args=(i,), delay=600_000, dedupe_key=key).message_id for i, key in enumerate(keys)
    }
    dq = sharded.delayed_queue("default")
    homes = {key: sharded.shard_router.key_shard("default", key) for key in keys}
    assert len(set(homes.values())) >= 3  # spread over the shards
    for key in keys:
        assert _shard_of_scheduled(sharded, sent[key]) == [homes[key]]
        found = dq.get_by_key(key)
        assert found is not None and found[1].message_id == sent[key]
    assert dq.get_by_key("order:none") is None and not dq.remove_by_key("order:none")
    assert dq.remove_by_key(keys[0]) and dq.get_by_key(keys[0]) is None and not dq.remove_by_key(keys[0])
    assert sent[keys[0]] not in dq
    # The queue shrinks to 2 shards (another process's setting): keys of the retired
    # shards are no longer where the layout hashes them, and are still found. An operator's
    # broker (no shards setting, as the CLI's) reads the stored layout.
    shrinking = RedissonBroker(url=redis_url, shards={"default": 2})
    assert len(shrinking.shard_router.layout("default").active) == 2
    shrinking.close()
    operator = RedissonBroker(url=redis_url)
    moved = [key for key in keys[1:] if operator.shard_router.key_shard("default", key) != homes[key]]
    assert moved
    view = operator.delayed_queue("default")
    assert isinstance(view, ShardedDelayedQueue)
    assert {shard.keys.queue_name for shard in view.shards} == {"default", *homes.values()}
    for key in moved:
        found = view.get_by_key(key)
        assert found is not None and found[1].message_id == sent[key]
    assert view.remove_by_key(moved[0]) and view.get_by_key(moved[0]) is None
    assert view.size() == 14
    operator.close()


def test_counts_next_due_and_bulk_steps_over_all_shards(
    sharded: RedissonBroker, actors: tuple[Actor[..., None], Actor[..., None]]
) -> None:
    alpha, beta = actors
    ids = [(alpha if i % 2 else beta).send_with_options(args=(i,), delay=_scramble(i)).message_id for i in range(20)]
    dq = sharded.delayed_queue("default")
    order = _expected_order(sharded)
    assert sorted(order) == sorted(ids)
    dues = [due for due, _ in dq.read_all()]
    assert dq.size() == len(dq) == dq.count() == 20
    assert dq.count(due_before=dues[4] + 1) == 5
    assert dq.next_due() == dues[0] == sharded.stats("default")["queues"]["default"]["next_due_ms"]
    assert dq.overdue() == 0
    # promote_all with a limit: the earliest of the whole queue
    assert dq.promote_all(limit=3) == 3
    now = server_ms(sharded.client)
    assert [i for i in order if dq.get(i)[0] <= now] == order[:3]  # type: ignore[index]
    assert dq.count(due_before=now + 1) == 3
    # remove_all with a limit: the 4 earliest now (the 3 promoted and the next)
    assert dq.remove_all(limit=4) == 4
    assert [m.message_id for _, m in dq.read_all()] == order[4:]
    # with a filter and a limit: the earliest 2 of beta's, over the shards
    betas = [m.message_id for _, m in dq.read_all() if m.actor_name == "beta"]
    assert dq.remove_all(actor_name="beta", limit=2) == 2
    assert [m.message_id for _, m in dq.read_all() if m.actor_name == "beta"] == betas[2:]
    alphas = [m.message_id for _, m in dq.read_all() if m.actor_name == "alpha"]
    assert dq.promote_all(actor_name="alpha") == len(alphas) > 0
    assert all(dq.get(i)[0] <= server_ms(sharded.client) for i in alphas)  # type: ignore[index]
    assert dq.clear() == 14 and dq.size() == 0 and dq.next_due() is None and dq.read_all() == []


# -- dead letters ----------------------------------------------------------------------


def _bury(broker: RedissonBroker, count: int) -> list[str]:
    """``count`` messages of an actor that always fails, run by a Worker until they are all
    dead letters (sent in turn: spread over the shards)."""

    @dramatiq.actor(max_retries=0)
    def doomed(i: int) -> None:
        raise RuntimeError(f"doomed {i}")

    ids = [doomed.send(i).message_id for i in range(count)]
    dead = broker.dead_letters("default")
    worker = Worker(broker, worker_timeout=100, worker_threads=2)
    worker.start()
    try:
        assert wait_for(lambda: dead.size() == count, timeout=30)
    finally:
        worker.stop()
    return ids


def _dead_shard(broker: RedissonBroker, redis_id: str) -> list[str]:
    return [n for n in _names(broker) if broker.client.zscore(broker.keys(n).xq, redis_id) is not None]


def _ready(broker: RedissonBroker, name: str) -> list[str]:
    return [m.decode() for m in cast("list[bytes]", broker.client.lrange(broker.keys(name).ready, 0, -1))]


def test_dead_letters_of_every_shard_listed_as_one_and_requeued_to_their_shard(sharded: RedissonBroker) -> None:
    ids = _bury(sharded, 12)
    dl = sharded.dead_letters("default")
    assert isinstance(dl, ShardedDeadLetters) and dl.queue_name == "default"
    assert sorted(shard.size() for shard in dl.shards) == [3, 3, 3, 3]
    assert dl.size() == len(dl) == 12
    # Oldest first, merged; pages newest first, across shards, each letter once
    listed = dl.read_all()
    assert sorted(m.message_id for _, m in listed) == sorted(ids)
    assert [died for died, _ in listed] == sorted(died for died, _ in listed)
    assert {m.queue_name for _, m in listed} == {"default"}
    assert [m.message_id for _, m in dl.read_all(limit=4)] == [m.message_id for _, m in listed[:4]]
    pages = [dl.page(start, 5) for start in (0, 5, 10)]
    assert [len(p) for p in pages] == [5, 5, 2]
    assert [m.message_id for p in pages for _, m in p] == [m.message_id for _, m in reversed(listed)]
    assert dl.page(12, 5) == []
    with pytest.raises(ValueError):
        dl.page(-1, 5)
    # One of each shard: found, and requeued to the ready queue of the shard it died in
    by_shard: dict[str, str] = {}
    for message_id in ids:
        by_shard.setdefault(_dead_shard(sharded, message_id)[0], message_id)
    assert len(by_shard) == 4
    for shard, message_id in by_shard.items():
        found = dl.get(message_id)
        assert found is not None and found[1].message_id == message_id
        assert [m.message_id for _, m in dl.find(message_id)] == [message_id]
        assert dl.requeue(message_id)
        assert message_id in _ready(sharded, shard)
        assert all(message_id not in _ready(sharded, other) for other in _names(sharded) if other != shard)
        assert not dl.requeue(message_id) and dl.get(message_id) is None
    assert dl.size() == 8
    # remove, and acting on redis ids of several shards at once
    rest = [m.message_id for _, m in dl.read_all()]
    assert dl.remove(rest[0]) and not dl.remove(rest[0])
    homes = {i: _dead_shard(sharded, i)[0] for i in rest[1:3]}
    assert dl.act("requeue", [rest[1], rest[2], "nope"]) == 2
    assert all(i in _ready(sharded, home) for i, home in homes.items())
    with pytest.raises(ValueError, match="action"):
        dl.act("explode", [rest[3]])
    # requeue_all with a limit: the oldest of the whole queue
    oldest = dl.read_all(limit=1)[0][1].message_id
    home = _dead_shard(sharded, oldest)[0]
    assert dl.requeue_all(limit=1) == 1 and oldest in _ready(sharded, home) and dl.size() == 4
    assert dl.clear() == 4 and dl.size() == 0 and dl.read_all() == []


# -- the CLI and the dashboard ----------------------------------------------------------


def test_cli_shows_each_shards_counts_and_lists_and_acts_over_the_shards(
    sharded: RedissonBroker, cli: Run, actors: tuple[Actor[..., None], Actor[..., None]]
) -> None:
    alpha, _ = actors

    @dramatiq.actor(queue_name="plain")
    def plain(i: int) -> None:
        pass

    ids = [alpha.send_with_options(args=(i,), delay=_scramble(i)).message_id for i in range(8)]
    alpha.send(99)
    plain.send_with_options(args=(1,), delay=600_000)
    names = _names(sharded)
    # stats: the queue's sums, then a row per shard
    table = cli("stats", "default")
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    row = next(line for line in lines if line.startswith("default ")).split()
    assert row[:2] == ["default", "1"] and row[3:5] == ["0", "8"]  # (row[2]: the ready one's wait)
    title = lines.index("Shards of 'default': 4 (the row above is their sum)")
    assert lines[title + 1].split()[:4] == ["shard", "ready", "latency", "in"]
    shard_rows = {line.split()[0]: line.split() for line in lines[title + 2 :] if line.startswith("default")}
    assert set(shard_rows) == set(names)
    assert sum(int(r[4]) for r in shard_rows.values()) == 8 and sum(int(r[1]) for r in shard_rows.values()) == 1
    # A queue without shards: no shard table (its output as before)
    plain_out = cli("stats", "plain").stdout
    assert "Shards of" not in plain_out and "~" not in plain_out
    document = ok_json(cli("--json", "stats", "default"))
    assert set(document["queues"]["default"]["shards"]) == set(names)
    # list: every shard's messages in one due order; cancel and reschedule in any shard
    listed = ok_json(cli("--json", "list", "default", "--limit", "0"))
    assert listed["scheduled"] == 8 and [m["message_id"] for m in listed["messages"]] == _expected_order(sharded)
    far = [i for i in ids if _shard_of_scheduled(sharded, i) != ["default"]][:2]
    result = cli("cancel", "default", *far)
    assert result.returncode == 0 and result.stdout.splitlines() == [f"cancelled {i}" for i in far]
    assert sharded.delayed_queue("default").size() == 6
    shown = ok_json(cli("--json", "show", "default", ids[-1]))
    assert shown["found"] and shown["message"]["message_id"] == ids[-1]


def test_cli_dead_letters_over_the_shards(sharded: RedissonBroker, cli: Run) -> None:
    ids = _bury(sharded, 8)
    listed = ok_json(cli("--json", "dead", "list", "default", "--limit", "0"))
    assert listed["dead"] == 8 and sorted(m["message_id"] for m in listed["messages"]) == sorted(ids)
    far = next(i for i in ids if _dead_shard(sharded, i) != ["default"])
    home = _dead_shard(sharded, far)[0]
    result = cli("dead", "requeue", "default", far)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"requeued {far}" and far in _ready(sharded, home)
    purged = cli("dead", "purge", "default", "--all", "--yes")
    assert purged.returncode == 0 and "7 dead letters" in purged.stdout
    assert sharded.dead_letters("default").size() == 0


def test_dashboard_queue_page_shows_the_shards_and_pages_over_them(
    sharded: RedissonBroker, actors: tuple[Actor[..., None], Actor[..., None]]
) -> None:
    alpha, _ = actors

    @dramatiq.actor(queue_name="plain")
    def plain(i: int) -> None:
        pass

    ids = [alpha.send_with_options(args=(i,), delay=_scramble(i)).message_id for i in range(30)]
    plain.send_with_options(args=(1,), delay=600_000)
    client = Client(make_app(sharded))
    page = client.get("/queues/default")
    assert page.status == 200
    # The shard table: a row per shard, its scheduled counts adding up to the queue's
    table = re.search(r'<table id="shards">(.*?)</table>', page.text, re.S)
    assert table, page.text
    rows = dict(re.findall(r'<tr data-shard="([^"]+)">(.*?)</tr>', table.group(1), re.S))
    assert set(rows) == set(_names(sharded))
    scheduled = [int(re.search(r'data-field="scheduled">(\d+)<', row).group(1)) for row in rows.values()]  # type: ignore[union-attr]
    assert sum(scheduled) == 30 and min(scheduled) > 0
    # A queue without shards has none
    assert 'id="shards"' not in client.get("/queues/plain").text
    # The scheduled list pages over all shards in due order
    seen: list[str] = []
    url = "/queues/default"
    while True:
        page = client.get(url)
        seen += re.findall(r'<tr data-id="([^"]+)"', page.text)
        more = re.search(r'href="([^"]+)" id="next-page"', page.text)
        if not more:
            break
        url = html.unescape(more.group(1))
    assert seen == _expected_order(sharded) and sorted(seen) == sorted(ids)
    # Cancel selected messages of several shards
    picked = [i for i in ids if _shard_of_scheduled(sharded, i) != ["default"]][:3]
    token = client.token("/queues/default")
    form = {"csrf": token, "action": "cancel", "ids": picked, "confirmed": "yes", "next": "/queues/default"}
    done = client.post("/queues/default/bulk", form)
    assert done.status == 303 and done.location()[1]["flash"] == "3 scheduled messages cancelled."
    assert sharded.delayed_queue("default").size() == 27


def test_dashboard_dead_letters_over_the_shards(sharded: RedissonBroker) -> None:
    ids = _bury(sharded, 6)
    client = Client(make_app(sharded))
    page = client.get("/queues/default/dead")
    assert page.status == 200 and "(6)" in page.text
    assert all(i in page.text for i in ids)
    far = next(i for i in ids if _dead_shard(sharded, i) != ["default"])
    home = _dead_shard(sharded, far)[0]
    token = client.token("/queues/default/dead")
    done = client.post(f"/queues/default/dead/{far}/requeue", {"csrf": token})
    assert done.status == 303 and "put back on the ready queue" in done.location()[1]["flash"]
    assert far in _ready(sharded, home)
    form = {"csrf": token, "action": "delete", "scope": "selected", "ids": ids[:2], "confirmed": "yes"}
    assert client.post("/queues/default/dead-bulk", form).status == 303
    assert sharded.dead_letters("default").size() == 6 - 1 - len([i for i in ids[:2] if i != far])
