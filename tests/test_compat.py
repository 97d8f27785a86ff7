"""Server versions: the broker runs on Redis >= 6.2 and Valkey (>= 7.0 on a cluster) and
refuses anything else at start, with one error naming the server's version, the missing
feature and the minimum; the ACL rule follows the server's version.

The whole suite runs against every server of the matrix with ``python -m tests.compat``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator

import dramatiq
import pytest
import redis
from redis.cluster import RedisCluster

from dramatiq_redisson import RedissonBroker, UnsupportedServer, acl_rule, acl_tokens
from dramatiq_redisson.connection._server import parse_version, refusal
from dramatiq_redisson.embedded import _binary_server, binary_version, server_binary
from tests.harness.topology import Cluster


def test_versions_parse_as_servers_report_them() -> None:
    assert parse_version("7.2.6") == (7, 2, 6)
    assert parse_version("6.2.16") == (6, 2, 16)
    assert parse_version("8.0") == (8, 0, 0)
    assert parse_version("7.4.0-rc1") == (7, 4, 0)
    assert parse_version("") == (0, 0, 0)


@pytest.mark.parametrize(
    ("name", "version", "cluster", "words"),
    [
        ("redis", (6, 0, 20), False, ["Redis 6.0.20", "ZMSCORE", "Redis >= 6.2"]),
        ("redis", (0, 0, 0), False, ["Redis < 6.2", "Redis >= 6.2"]),
        ("redis", (6, 2, 16), True, ["Redis 6.2.16", "sharded pub/sub", "Redis >= 7.0"]),
        ("redis", (5, 0, 14), True, ["Redis 5.0.14", "Redis >= 6.2"]),  # too old, cluster or not
    ],
)
def test_an_unsupported_server_is_named_with_its_version_the_feature_and_the_minimum(
    name: str, version: tuple[int, int, int], cluster: bool, words: list[str]
) -> None:
    reason = refusal(name, version, cluster=cluster)
    assert reason is not None and all(word in reason for word in words), reason


@pytest.mark.parametrize(
    ("name", "version", "cluster"),
    [("redis", (6, 2, 0), False), ("redis", (7, 0, 0), True), ("valkey", (7, 2, 7), True), ("valkey", (9, 1, 2), True)],
)
def test_a_supported_server_is_not_refused(name: str, version: tuple[int, int, int], cluster: bool) -> None:
    assert refusal(name, version, cluster=cluster) is None


def test_the_rule_follows_the_server_version() -> None:
    # Given the rule for each family of servers
    latest, r70, r62 = (acl_tokens(server_version=v) for v in (None, (7, 0, 15), (6, 2, 16)))
    # Then 7.2 and later (and Valkey) grant CLIENT SETINFO, which redis-py sends on connect
    assert "+client|setinfo" in latest and acl_tokens(server_version=(7, 2, 6)) == latest
    assert acl_tokens(server_version=(9, 1, 2)) == latest
    # And 7.0/7.1 leave it out: their ACL SETUSER refuses the unknown subcommand
    assert "+client|setinfo" not in r70 and set(latest) - set(r70) == {"+client|setinfo"}
    # And 6.2 names redis-py's handshake subcommands, which it checks before knowing them
    assert set(r62) - set(latest) == {"+client|maint_notifications"}
    assert acl_rule(server_version=(7, 0, 15)) == " ".join(r70)


def test_the_session_server_is_checked_and_accepted(
    broker: RedissonBroker, server_version: tuple[int, int, int]
) -> None:
    # Given a broker on the session's server, When it checks the server
    versions = broker.check_server()
    # Then it knows the version the server reports, and accepts it
    assert list(versions) == [""] and broker.server_version == server_version >= (6, 2, 0)
    if not os.environ.get("REDIS_URL"):
        assert server_version == binary_version()


@pytest.fixture
def hello_less_url() -> Iterator[str]:
    """A server that answers HELLO with an error, as every server before 6.2 does (5.x
    does not know it; 6.0 wants a protocol version)."""
    with _binary_server(server_binary(), {"rename_command": ("HELLO", "")}) as url:
        yield f"{url}?protocol=2"  # redis-py's RESP3 handshake is HELLO 3


def test_a_server_older_than_6_2_is_refused_before_anything_is_written(hello_less_url: str) -> None:
    # Given a broker on a server that does not answer HELLO without a protocol version
    broker = RedissonBroker(url=hello_less_url)
    client = redis.Redis.from_url(hello_less_url)
    try:

        @dramatiq.actor(broker=broker)
        def job() -> None: ...

        # When a message is sent, or a consumer starts
        with pytest.raises(UnsupportedServer, match=r"Redis < 6\.2 is too old.*Redis >= 6\.2") as sent:
            job.send_with_options(delay=1000)
        consumer = broker.consume("default")
        with pytest.raises(UnsupportedServer):
            next(consumer)  # its first tick, before any fetch
        consumer.close()
        # Then the error says what is missing, and nothing was written
        assert sent.value.version == (0, 0, 0)
        assert client.dbsize() == 0
    finally:
        client.close()
        broker.close()


@pytest.mark.server_binary(below=(7, 0, 0))
def test_a_cluster_without_sharded_pubsub_is_refused_before_anything_is_written() -> None:
    # Given a cluster of a server older than 7.0 (no SPUBLISH/SSUBSCRIBE)
    with Cluster(masters=3, replicas=0) as cluster:
        broker = RedissonBroker(url=cluster.url, cluster=True)
        try:

            @dramatiq.actor(broker=broker)
            def job() -> None: ...

            # When a message is sent, or a consumer starts, or its ACL rule is asked for
            with pytest.raises(UnsupportedServer) as sent:
                job.send_with_options(delay=1000)
            consumer = broker.consume("default")
            with pytest.raises(UnsupportedServer):
                next(consumer)  # its first tick, before any fetch
            consumer.close()
            # Then one error names the version, the feature and the minimum
            version = ".".join(map(str, binary_version()))
            text = str(sent.value)
            assert f"Redis {version}" in text and "sharded pub/sub" in text and "Redis >= 7.0" in text, text
            # And nothing was written on any node
            client = broker.client
            assert isinstance(client, RedisCluster)
            assert client.dbsize(target_nodes=RedisCluster.PRIMARIES) == 0
        finally:
            broker.close()


def test_the_cli_prints_the_rule_for_the_connected_server(redis_url: str, server_version: tuple[int, int, int]) -> None:
    # Given the session's server, When an operator asks the CLI for the rule
    env = {**os.environ, "REDIS_URL": redis_url}
    command = [sys.executable, "-m", "dramatiq_redisson", "--namespace", "shop", "acl-rule", "--user", "worker"]
    shown = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    # Then it is the ACL SETUSER command with the rule for that server's version
    rule = acl_rule("shop", server_version=server_version)
    assert shown.stdout == f"ACL SETUSER worker on ><password> {rule}\n"
    assert ".".join(map(str, server_version)) in shown.stderr
    # And without a server, for a version given: 7.0 has no CLIENT SETINFO to grant
    offline = subprocess.run(
        [sys.executable, "-m", "dramatiq_redisson", "acl-rule", "--server-version", "7.0", "--json"],
        capture_output=True,
        text=True,
        check=True,
    )
    document = json.loads(offline.stdout)
    assert document["rule"] == acl_rule(server_version=(7, 0, 0)) and "+client|setinfo" not in document["rule"]
    too_old = subprocess.run(
        [sys.executable, "-m", "dramatiq_redisson", "acl-rule", "--server-version", "6.0"],
        capture_output=True,
        text=True,
    )
    assert too_old.returncode == 2 and "Redis >= 6.2" in too_old.stderr
