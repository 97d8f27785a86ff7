"""Least privilege on Redis Cluster: ``acl_rule(cluster=True)`` covers every command a
cluster broker and redis-py's cluster client send, a user with exactly that rule on every
node runs a worker end to end, and the permission probe works on a cluster client.

Every live test runs on one local cluster of three masters (``tests/harness/topology.py``)."""

from __future__ import annotations

import re
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

import dramatiq
import pytest
import redis
from dramatiq import Worker
from dramatiq.middleware import default_middleware
from redis.cluster import RedisCluster
from redis.crc import key_slot
from redis.exceptions import NoPermissionError, RedisClusterException

from dramatiq_redisson import QueueKeys, RedissonBroker
from dramatiq_redisson.connection._acl_rule import (
    CLUSTER_CLIENT_COMMANDS,
    CLUSTER_COMMANDS,
    COMMANDS,
    NOT_ON_CLUSTER,
    SHARDED_PUBSUB,
    channel_patterns,
    key_patterns,
)
from dramatiq_redisson.connection._permissions import (
    _CLUSTER_PROBE_SOURCE,
    MissingPermission,
    _client_calls,
    _routed_calls,
    acl_rule,
    acl_tokens,
    check_permissions,
    is_permission_error,
    scratch_key,
)
from dramatiq_redisson.connection._topology import Cluster as ClusterTopology
from dramatiq_redisson.embedded import binary_version
from dramatiq_redisson.scripts._calls import _SOURCES
from tests.connection.test_acl import DOCS, lua_commands
from tests.harness.topology import HOST, Cluster, Server
from tests.helpers import wait_for

# -- the rule ---------------------------------------------------------------------------


def test_cluster_rule_text() -> None:
    rule = acl_rule(cluster=True)
    assert rule == " ".join(acl_tokens(cluster=True))
    tokens = rule.split()
    assert tokens[:3] == ["resetkeys", "resetchannels", "-@all"]
    granted = {t[1:] for t in tokens if t.startswith("+")}
    assert granted == set(CLUSTER_COMMANDS)
    # Sharded pub/sub instead of the plain one; redis-py's cluster client's own commands.
    assert {"spublish", "ssubscribe", "sunsubscribe", "asking", "cluster|slots", "command"} <= granted
    assert not granted & {"publish", "subscribe", "unsubscribe", "scan", "select", "script|exists"}
    assert granted == (set(COMMANDS) - set(SHARDED_PUBSUB) - set(NOT_ON_CLUSTER)) | {
        *SHARDED_PUBSUB.values(),
        *CLUSTER_CLIENT_COMMANDS,
    }
    assert rule.endswith(
        "~dramatiq:* ~{dramatiq:* ~redisson_delay_queue*:{dramatiq:*} &redisson_delay_queue_channel:{dramatiq:*}"
    )
    assert "+wait" not in tokens and "+wait" in acl_rule(cluster=True, wait_for_replicas=True).split()
    assert key_patterns("a*b?", cluster=True) == (r"a\*b\?:*", r"{a\*b\?:*", r"redisson_delay_queue*:{a\*b\?:*}")
    # Each key of a queue in the cluster layout matches a pattern, each channel a channel
    # pattern; other namespaces' do not.
    keys = QueueKeys("shop", "mail", cluster=True)
    names = [*keys.every_name("w1", "w1.1"), keys.registry, scratch_key(keys)]
    for name in names:
        assert any(fnmatchcase(name, p) for p in key_patterns("shop", cluster=True)), name
        assert not any(fnmatchcase(name, p) for p in key_patterns("other", cluster=True)), name
    assert not any(fnmatchcase(keys.ready, p) for p in key_patterns("shop")), "the single-server rule grew"
    for channel in (keys.channel, keys.wake_channel("0f5c-uuid.12")):
        assert fnmatchcase(channel, channel_patterns("shop")[0]), channel


def test_cluster_rule_has_every_command_of_the_cluster_scripts(tmp_path: Path) -> None:
    """The scripts as a cluster broker loads them (PUBLISH rewritten to SPUBLISH)."""
    used: set[str] = set()
    for name, source in _SOURCES.items():
        path = tmp_path / f"{name}.lua"
        path.write_bytes(ClusterTopology(None).script_source(source))
        used |= lua_commands(path)
    assert "spublish" in used and "publish" not in used
    assert used <= set(CLUSTER_COMMANDS), sorted(used - set(CLUSTER_COMMANDS))


def test_cluster_probe_tries_every_command_of_the_cluster_rule() -> None:
    keys = QueueKeys("dramatiq", "q", cluster=True)
    in_script = {c.lower() for c in re.findall(r"check\(\"([A-Z]+)\"", _CLUSTER_PROBE_SOURCE.decode())}
    assert "spublish" in in_script and "publish" not in in_script
    calls = _client_calls(keys, "w") + _routed_calls(keys)
    tried = in_script | {command for command, _, _ in calls} | {"ssubscribe", "sunsubscribe"}
    # CLIENT SETINFO is redis-py's connection setup: it runs before any probe could.
    assert set(CLUSTER_COMMANDS) - {"client|setinfo"} <= tried, sorted(set(CLUSTER_COMMANDS) - tried)
    assert tried <= set(CLUSTER_COMMANDS), sorted(tried - set(CLUSTER_COMMANDS))
    # Everything sent to the queue's node is in the queue's slot.
    argv = next(call for command, _, call in calls if command == "evalsha")
    local = [a for a in argv[4:] if isinstance(a, str) and ("{" in a)]
    assert len(local) >= 15 and {key_slot(k.encode()) for k in local} == {key_slot(keys.ready.encode())}


def test_docs_carry_the_generated_cluster_rule() -> None:
    text = DOCS.read_text()
    assert acl_rule(cluster=True) in text, "docs/security.md: paste acl_rule(cluster=True)'s output again"
    assert acl_rule("myapp", cluster=True) in text, "docs/security.md: paste acl_rule('myapp', cluster=True) again"
    readme = (DOCS.parent / "security.md").read_text()  # the README's rule moved to the docs site's page
    assert acl_rule(cluster=True) in readme, "docs/security.md: paste acl_rule(cluster=True)'s output again"


# -- a restricted user on every node of a local cluster ----------------------------------

User = tuple[str, str]


#: The broker on a cluster needs sharded pub/sub (Redis 7.0): see tests/test_compat.py.
NEEDS_SHARDED_PUBSUB = pytest.mark.server_binary(min=(7, 0, 0))


def node_tokens(*args: Any, **kwargs: Any) -> list[str]:
    """``acl_tokens`` for the version of the cluster's servers (the rule follows it)."""
    return acl_tokens(*args, server_version=binary_version(), **kwargs)


def node_rule(*args: Any, **kwargs: Any) -> str:
    """``acl_rule`` for the version of the cluster's servers."""
    return acl_rule(*args, server_version=binary_version(), **kwargs)


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    with Cluster(masters=3, replicas=0) as c:
        yield c


@pytest.fixture
def admin(cluster: Cluster) -> Iterator[RedisCluster]:
    """The default user's cluster client; every node emptied and its ACL log reset."""
    client = cluster.client()
    client.flushall()
    _reset_acl_logs(cluster)
    yield client
    client.flushall()
    client.close()


@pytest.fixture
def make_user(cluster: Cluster) -> Iterator[Callable[[list[str]], User]]:
    """Create an ACL user (``on``, a random password, the given tokens) on every node;
    returns its name and password. Deleted from every node at teardown."""
    made: list[str] = []

    def make(tokens: list[str]) -> User:
        name = f"dramatiq-redisson-test-{secrets.token_hex(4)}"
        password = secrets.token_urlsafe(16)
        for node in cluster.nodes:
            cluster.admin(node).execute_command("ACL SETUSER", name, "reset", "on", f">{password}", *tokens)
        made.append(name)
        return name, password

    yield make
    for name in made:
        for node in cluster.nodes:
            cluster.admin(node).execute_command("ACL DELUSER", name)


def _login(cluster: Cluster, user: User) -> RedisCluster:
    return cluster.client(username=user[0], password=user[1])


def _reset_acl_logs(cluster: Cluster) -> None:
    for node in cluster.nodes:
        cluster.admin(node).acl_log_reset()


def _acl_log(cluster: Cluster, user: User) -> list[dict[str, Any]]:
    """The ACL log entries of ``user`` on every node."""
    entries = [e for node in cluster.nodes for e in cluster.admin(node).acl_log(count=1000)]
    return [dict(e) for e in entries if e["username"] == user[0]]


def _queues_on(cluster: Cluster, count: int) -> list[str]:
    """Names of ``count`` queues (default namespace) whose slots different masters own."""
    by_master: dict[str, str] = {}
    for i in range(1000):
        name = f"acl-{i}"
        by_master.setdefault(cluster.master_of_key(QueueKeys("dramatiq", name, cluster=True).ready).node_id, name)
        if len(by_master) == count:
            return list(by_master.values())
    raise AssertionError("no queue names for enough masters")


@NEEDS_SHARDED_PUBSUB
def test_whole_flow_on_a_cluster_as_a_user_with_exactly_the_cluster_rule(
    cluster: Cluster, admin: RedisCluster, make_user: Callable[[list[str]], User]
) -> None:
    user = make_user(node_tokens(cluster=True))
    client = _login(cluster, user)
    try:
        # The user can do nothing outside its namespace.
        with pytest.raises(NoPermissionError):
            client.get("elsewhere")
        _reset_acl_logs(cluster)

        broker = RedissonBroker(client=client, middleware=[m() for m in default_middleware])
        assert broker.cluster
        broker.safety_interval = 1000
        broker.maintenance_interval = 200  # maintenance (dead workers) runs within the test
        first, second = _queues_on(cluster, 2)  # two queues, on two nodes
        keys = broker.keys(first)
        ran: list[str] = []
        attempts: dict[str, int] = {}
        lock = threading.Lock()

        @dramatiq.actor(queue_name=first, max_retries=0, broker=broker)
        def job(name: str) -> None:
            with lock:
                ran.append(name)

        @dramatiq.actor(queue_name=second, max_retries=0, broker=broker)
        def other(name: str) -> None:
            with lock:
                ran.append(name)

        @dramatiq.actor(queue_name=first, max_retries=3, min_backoff=100, max_backoff=100, broker=broker)
        def flaky(name: str) -> None:
            with lock:
                attempts[name] = attempts.get(name, 0) + 1
                if attempts[name] == 1:
                    raise RuntimeError("first attempt fails")
                ran.append(name)

        @dramatiq.actor(queue_name=first, max_retries=0, broker=broker)
        def doomed() -> None:
            raise RuntimeError("dead letter")

        # A dead worker with stranded work: the consumer's maintenance runs as the user.
        admin.zadd(keys.heartbeats, {"dead-worker": 0})
        admin.sadd(keys.acks("dead-worker"), "stranded-id")

        # The probe runs on a cluster client and finds nothing missing.
        for queue in (first, second):
            check_permissions(client, broker.keys(queue), worker_id=broker.broker_id)

        job.send("now")
        job.send_with_options(args=("later",), delay=200)
        other.send("other-now")
        other.send_with_options(args=("other-later",), delay=300)
        flaky.send("retried")
        doomed.send()
        cancelled = job.send_with_options(args=("cancelled",), delay=60_000)
        delayed = broker.delayed_queue(first)
        assert delayed.contains(cancelled.message_id)
        assert delayed.size() >= 2 and delayed.next_due() is not None
        assert delayed.get(cancelled.message_id) is not None
        assert delayed.remove(cancelled.message_id)
        broker.enqueue_many([job.message(f"bulk-now-{i}") for i in range(3)])
        broker.enqueue_many([job.message(f"bulk-later-{i}") for i in range(3)], delay=100)

        worker = Worker(broker, worker_timeout=100, worker_threads=2)
        worker.start()
        try:
            expected = {"now", "later", "other-now", "other-later", "retried"}
            expected |= {f"bulk-{w}-{i}" for w in ("now", "later") for i in range(3)}
            assert wait_for(lambda: expected <= set(ran), timeout=15), sorted(ran)
            broker.join(first, timeout=10_000)
            broker.join(second, timeout=10_000)
            assert wait_for(lambda: admin.zscore(keys.heartbeats, "dead-worker") is None, timeout=10)
            worker.join()
        finally:
            worker.stop()

        assert "cancelled" not in ran and attempts["retried"] == 2
        dead = broker.dead_letters(first)
        assert dead.size() == 1
        (_, letter), *_ = dead.read_all()
        assert dead.get(letter.options["redis_message_id"]) is not None  # MULTI/EXEC on a cluster
        stats = broker.stats()
        assert {first, second} <= set(stats["queues"]) and stats["queues"][first]["dead"] == 1
        assert broker.pending(first) == 0

        broker.flush_all()
        assert admin.keys("redisson_delay_queue*") == []
        assert not admin.exists(keys.ready) and not admin.exists(keys.xq)
        broker.close()
    finally:
        client.close()

    # Not one refusal on any node, not even an ignored one (CLIENT SETINFO).
    assert _acl_log(cluster, user) == []


@NEEDS_SHARDED_PUBSUB
def test_a_user_without_spublish_is_refused_and_the_probe_names_it(
    cluster: Cluster, admin: RedisCluster, make_user: Callable[[list[str]], User]
) -> None:
    user = make_user([t for t in node_tokens(cluster=True) if t != "+spublish"])
    client = _login(cluster, user)
    try:
        broker = RedissonBroker(client=client)
        queue = "acl-nospublish"

        @dramatiq.actor(queue_name=queue, broker=broker)
        def job() -> None:  # pragma: no cover - never runs
            pass

        # A delayed send announces its due time with SPUBLISH: refused.
        with pytest.raises(redis.ResponseError) as refused:
            job.send_with_options(delay=60_000)
        assert is_permission_error(refused.value) and "spublish" in str(refused.value)
        assert {e["object"] for e in _acl_log(cluster, user)} == {"spublish"}

        with pytest.raises(MissingPermission) as missing:
            check_permissions(client, broker.keys(queue))
        error = missing.value
        assert error.commands == ("spublish",)
        assert error.keys == () and error.channels == () and error.unchecked == ()
        assert node_rule(cluster=True) in str(error) and "on every node of the cluster" in str(error)
    finally:
        client.close()


@NEEDS_SHARDED_PUBSUB
def test_cluster_probe_names_every_missing_command_key_and_channel(
    cluster: Cluster, admin: RedisCluster, make_user: Callable[[list[str]], User]
) -> None:
    tokens = [t for t in node_tokens(cluster=True) if t not in ("+asking", "+ssubscribe", "+srem", "~{dramatiq:*")]
    tokens = [t for t in tokens if not t.startswith("&")]
    client = _login(cluster, make_user(tokens))
    try:
        keys = QueueKeys("dramatiq", "default", cluster=True)
        with pytest.raises(MissingPermission) as info:
            check_permissions(client, keys)
        error = info.value
        assert error.commands == ("asking", "srem", "ssubscribe")
        # SPUBLISH inside the probe names the channel.
        assert error.channels == (keys.channel,)
        assert {k.split(" ")[0] for k in error.keys} == {
            keys.ready,
            keys.ready_msgs,
            keys.xq,
            keys.xq_msgs,
            keys.legacy_dq,
            keys.legacy_dq_msgs,
            scratch_key(keys),
        }
        # Without DEL/UNLINK on the scratch key (nor SREM, HDEL), nothing could undo a push.
        assert set(error.unchecked) == {"hincrby", "hsetnx", "lpush", "rpush", "sadd"}
        # Keys of the single-server layout with a cluster client, or the reverse: refused.
        with pytest.raises(ValueError, match="layout"):
            check_permissions(client, QueueKeys("dramatiq", "default"))
        single = redis.Redis(host=HOST, port=cluster.masters[0].port)
        with pytest.raises(ValueError, match="layout"):
            check_permissions(single, keys)
        single.close()
    finally:
        client.close()


@NEEDS_SHARDED_PUBSUB
def test_the_single_server_rule_cannot_even_connect_to_a_cluster(
    cluster: Cluster, admin: RedisCluster, make_user: Callable[[list[str]], User]
) -> None:
    """Without CLUSTER SLOTS, redis-py's cluster client cannot start (and says the node is
    no cluster node); docs/security.md warns about that message."""
    user = make_user(node_tokens())
    with pytest.raises(RedisClusterException, match="Cluster mode is not enabled"):
        _login(cluster, user)
    assert "cluster|slots" in {e["object"] for e in _acl_log(cluster, user)}


@NEEDS_SHARDED_PUBSUB
def test_a_slot_migration_needs_asking(
    cluster: Cluster, admin: RedisCluster, make_user: Callable[[list[str]], User]
) -> None:
    """While a queue's slot migrates, the cluster client follows ASK redirects with
    ASKING: the rule grants it, and without it the broker's reads are refused."""
    queue = "acl-migrating"
    slot = key_slot(QueueKeys("dramatiq", queue, cluster=True).ready.encode())
    source = cluster.master_of_slot(slot)
    target: Server = next(m for m in cluster.masters if m is not source)
    granted = _login(cluster, make_user(node_tokens(cluster=True)))
    lacking_user = make_user([t for t in node_tokens(cluster=True) if t != "+asking"])
    lacking = _login(cluster, lacking_user)
    cluster.admin(target).execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", source.node_id)
    cluster.admin(source).execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", target.node_id)
    try:
        # The queue's keys are absent on the source: it answers ASK, the client asks the target.
        brokers = [RedissonBroker(client=client) for client in (granted, lacking)]
        for each in brokers:
            each.declare_queue(queue)  # (a queue must be known to be operated)
        assert brokers[0].delayed_queue(queue).size() == 0
        with pytest.raises(NoPermissionError, match="asking"):
            brokers[1].delayed_queue(queue).size()
        assert {e["object"] for e in _acl_log(cluster, lacking_user)} == {"asking"}
    finally:
        for node in (source, target):
            cluster.admin(node).execute_command("CLUSTER", "SETSLOT", slot, "STABLE")
        granted.close()
        lacking.close()


@NEEDS_SHARDED_PUBSUB
def test_cluster_probe_changes_nothing(
    cluster: Cluster, admin: RedisCluster, make_user: Callable[[list[str]], User]
) -> None:
    broker = RedissonBroker(client=admin)
    queue = "acl-busy"
    keys = broker.keys(queue)

    @dramatiq.actor(queue_name=queue, broker=broker)
    def job(i: int) -> None:  # pragma: no cover - never runs
        pass

    for i in range(3):
        job.send(i)
        job.send_with_options(args=(i,), delay=60_000 + i)
    admin.sadd(keys.acks("w1"), "in-flight")
    admin.zadd(keys.xq, {"dead": 1})
    admin.hset(keys.xq_msgs, "dead", "x")
    admin.set(keys.compact_cursor, "3", px=600_000)

    def state() -> dict[Any, tuple[Any, bool]]:
        found: dict[Any, tuple[Any, bool]] = {}
        for node in cluster.masters:
            node_admin = cluster.admin(node)
            for key in node_admin.keys("*"):
                found[key] = (node_admin.dump(key), node_admin.pttl(key) > 0)
        return found

    before = state()
    assert len(before) >= 9
    started = time.monotonic()
    check_permissions(admin, keys, worker_id="w1")
    restricted = _login(cluster, make_user(node_tokens(cluster=True)))
    try:
        check_permissions(restricted, keys, worker_id="w1")
    finally:
        restricted.close()
    assert time.monotonic() - started < 2
    assert state() == before
