"""Every mistake in building a broker, declaring an actor or a periodic schedule is refused
where it is made, with one message that names it (issue 47), and writes nothing: an
unknown argument (with the closest known name), ``url=`` with ``client=``, ``cluster=True``
against a server without cluster mode, a bad ``broker_priority``/``group_key`` default, an
``every=`` without a unit. ``shards=`` on one server works but gains nothing: a warning
says so."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import dramatiq
import pytest
import redis
from redis.exceptions import RedisClusterException

from dramatiq_redisson import RedissonBroker, periodic
from dramatiq_redisson.periodic._schedules import InvalidSchedule, declared_schedules
from tests.harness.topology import Cluster


@contextmanager
def untouched(client: redis.Redis, *, no_connection: bool = True) -> Iterator[None]:
    """The block writes nothing (the keyspace is the same after it) and, with
    ``no_connection``, opens no connection to the server (the server's count of accepted
    connections is the same)."""
    keys = sorted(client.keys("*"))
    accepted = client.info("stats")["total_connections_received"]
    yield
    assert sorted(client.keys("*")) == keys
    if no_connection:
        assert client.info("stats")["total_connections_received"] == accepted


def refusal(make: Callable[[], Any], error: type[Exception] = ValueError) -> str:
    """The text of the error ``make()`` raises."""
    with pytest.raises(error) as raised:
        made = make()
        made.close()  # not reached when refused
    return str(raised.value)


# -- the constructor's arguments ------------------------------------------------------


def test_an_unknown_argument_is_refused_with_the_closest_name(redis_url: str, redis_client: redis.Redis) -> None:
    """The issue's typo: refused when the broker is built, before a client is made (it
    used to build, warn about retries, and fail the first send with a TypeError)."""
    with untouched(redis_client):
        message = refusal(lambda: RedissonBroker(url=redis_url, transfer_batch_szie=10))
    assert message == "unknown argument transfer_batch_szie: did you mean transfer_batch_size?"


def test_bad_settings_and_unknown_names_come_in_one_error(redis_url: str, redis_client: redis.Redis) -> None:
    with untouched(redis_client):
        message = refusal(
            lambda: RedissonBroker(url=redis_url, transfer_batch_size=0, socket_timout=5, colour="red", wait_timeout=0)
        )
    assert message == (
        "transfer_batch_size must be a positive int, got 0; wait_timeout must be a positive int, got 0; "
        "unknown argument colour: neither RedissonBroker nor redis-py takes it; "
        "unknown argument socket_timout: did you mean socket_timeout?"
    )


def test_a_cluster_clients_parameter_needs_cluster(redis_url: str, redis_client: redis.Redis) -> None:
    """redis-py's client for one server would take it at build and fail at the first
    connection: refused here, saying what it belongs to."""
    with untouched(redis_client):
        message = refusal(lambda: RedissonBroker(url=redis_url, read_from_replicas=True))
    assert message == "unknown argument read_from_replicas: a parameter of redis-py's cluster client, give cluster=True"


def test_redis_py_parameters_still_pass(redis_url: str, redis_client: redis.Redis) -> None:
    """Names redis-py takes pass through, as with Dramatiq's RedisBroker, and apply."""
    broker = RedissonBroker(url=redis_url, socket_timeout=7, health_check_interval=30, client_name="refusals")
    try:
        kwargs = broker.client.connection_pool.connection_kwargs
        assert kwargs["socket_timeout"] == 7 and kwargs["health_check_interval"] == 30
        noop = dramatiq.actor(lambda: None, actor_name="noop", broker=broker)
        noop.send()
        assert broker.pending("default") == 1
        assert any(c.get("name") == "refusals" for c in redis_client.client_list())
    finally:
        broker.close()


def test_url_with_client_is_refused(redis_url: str, redis_client: redis.Redis) -> None:
    """The client would be used and the url ignored; connection parameters likewise."""
    client = redis.Redis.from_url(redis_url)
    try:
        with untouched(redis_client):
            both = refusal(lambda: RedissonBroker(url=redis_url, client=client))
            with_parameters = refusal(lambda: RedissonBroker(client=client, socket_timeout=3, db=2))
    finally:
        client.close()
    assert (
        both == "url= and client= given together: the broker would use client= and ignore url=; pass only one of them"
    )
    assert with_parameters == (
        "connection parameters given with client= (db, socket_timeout): the broker would ignore them; "
        "set them on the client you pass"
    )


def test_cluster_against_a_server_without_cluster_mode(redis_url: str, redis_client: redis.Redis) -> None:
    """Our error, saying what to change, instead of redis-py's RedisClusterException (kept
    as the cause). Finding out takes connections, and writes nothing."""
    address = "{host}:{port}".format(**redis.Redis.from_url(redis_url).connection_pool.connection_kwargs)
    with untouched(redis_client, no_connection=False), pytest.raises(ValueError) as raised:
        RedissonBroker(url=redis_url, cluster=True)
    assert str(raised.value) == (
        f"{address} is not a cluster node (cluster_enabled:0): drop cluster=True, or point url at a cluster node"
    )
    assert isinstance(raised.value.__cause__, RedisClusterException)
    host, port = address.rsplit(":", 1)
    with untouched(redis_client, no_connection=False), pytest.raises(ValueError) as raised:
        RedissonBroker(cluster=True, host=host, port=int(port))
    assert str(raised.value) == (
        f"{address} is not a cluster node (cluster_enabled:0): drop cluster=True, or point host/port at a cluster node"
    )


def _shard_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and "shards=" in r.getMessage()]


def test_shards_on_one_server_warn_once_and_work(
    redis_url: str, redis_client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    """docs/sharding-design.md: on one server shards work (the tests use them) but gain
    nothing, so the broker builds and says why, once."""
    caplog.set_level(logging.WARNING)
    broker = RedissonBroker(url=redis_url, shards={"default": 3, "other": 1})
    try:
        assert _shard_warnings(caplog) == [
            "shards={'default': 3, 'other': 1} on a single server gains nothing: every shard of a queue "
            "lives on this one server, whose throughput and memory bound the queue as without shards, "
            "and the shards cost a few more commands per message. Shards spread a queue over a Redis "
            "Cluster's masters (cluster=True); the queues are sharded as asked."
        ]
        noop = dramatiq.actor(lambda: None, actor_name="noop", broker=broker)
        for _ in range(6):
            noop.send()
        assert broker.pending("default") == 6
        assert len(broker.shards_of("default")) == 3
    finally:
        broker.flush_all()
        broker.close()
    caplog.clear()
    RedissonBroker(url=redis_url, shards={"default": 1}).close()  # one shard: nothing to say
    assert _shard_warnings(caplog) == []


@pytest.mark.topology
@pytest.mark.server_binary(min=(7, 0, 0))
def test_on_a_cluster_shards_do_not_warn(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    with Cluster(masters=3, replicas=0) as cluster:
        broker = RedissonBroker(url=cluster.url, cluster=True, shards={"default": 3})
        try:
            assert broker.cluster
            assert _shard_warnings(caplog) == []
        finally:
            broker.close()


# -- actor options --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"broker_priority": "high"}, "actor 'job': broker_priority must be a non-negative int, got 'high'"),
        ({"broker_priority": -1}, "actor 'job': broker_priority must be a non-negative int, got -1"),
        ({"broker_priority": True}, "actor 'job': broker_priority must be a non-negative int, got True"),
        ({"group_key": ""}, "actor 'job': group_key must be a non-empty string of at most 256 characters, got ''"),
        (
            {"group_key": 7, "broker_priority": 2.5},
            "actor 'job': broker_priority must be a non-negative int, got 2.5; "
            "group_key must be a non-empty string of at most 256 characters, got 7",
        ),
    ],
)
def test_a_bad_actor_option_is_refused_when_declared(
    broker: RedissonBroker, redis_client: redis.Redis, options: dict[str, Any], words: str
) -> None:
    """Declared, not at every send: the actor is not declared, nothing is written."""
    with untouched(redis_client):
        with pytest.raises(ValueError) as raised:
            dramatiq.actor(lambda: None, actor_name="job", **options)
        assert str(raised.value) == words
    assert "job" not in broker.actors


def test_good_actor_options_declare_and_per_message_overrides_are_checked_at_send(
    broker: RedissonBroker, redis_client: redis.Redis
) -> None:
    job = dramatiq.actor(lambda: None, actor_name="job", broker_priority=3, group_key="tenant-a")
    assert broker.actors["job"] is job
    with untouched(redis_client, no_connection=False), pytest.raises(ValueError) as raised:
        job.send_with_options(broker_priority="urgent")
    assert str(raised.value) == "broker_priority must be a non-negative int, got 'urgent'"
    job.send_with_options(group_key=None)  # None: no group, not a bad one
    assert broker.pending("default") == 1


def test_dedupe_options_are_message_options_only(broker: RedissonBroker, redis_client: redis.Redis) -> None:
    """dedupe_key, dedupe and dedupe_ttl apply per send: as an actor's default Dramatiq
    refuses them when the actor is declared."""
    with untouched(redis_client), pytest.raises(ValueError, match="actor options are undefined: dedupe_key"):
        dramatiq.actor(lambda: None, actor_name="keyed", dedupe_key="k")
    assert "keyed" not in broker.actors


# -- periodic actors -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("every", "words"),
    [
        (2, 'every=2 has no unit: write every=timedelta(seconds=2) or every="2s"'),
        (0.5, 'every=0.5 has no unit: write every=timedelta(seconds=0.5) or every="0.5s"'),
        ("2", "every: duration '2' needs a unit, e.g. 2s or 2ms"),
        ("50ms", "every: must be at least 0.1s (100 ms), got '50ms'"),
    ],
)
def test_every_without_a_unit_is_refused_when_declared(
    broker: RedissonBroker, redis_client: redis.Redis, every: Any, words: str
) -> None:
    job = dramatiq.actor(lambda: None, actor_name="tick")
    with untouched(redis_client):
        with pytest.raises(InvalidSchedule) as raised:
            periodic(every=every, name="refused-tick")(job)
        assert str(raised.value) == words
    assert "refused-tick" not in declared_schedules()


def test_every_with_a_unit_is_stored_in_milliseconds(broker: RedissonBroker, redis_client: redis.Redis) -> None:
    job = dramatiq.actor(lambda: None, actor_name="tick")
    periodic(every="1500ms", name="unit-ms")(job)
    periodic(every=timedelta(minutes=2), name="unit-td")(job)
    declared = declared_schedules()
    assert declared["unit-ms"].spec.every_ms == 1500
    assert declared["unit-td"].spec.every_ms == 120_000
    assert broker.schedules.reconcile("default") == ["unit-ms", "unit-td"]
    stored = {info.name: info.every_ms for info in broker.schedules.list()}
    assert stored == {"unit-ms": 1500, "unit-td": 120_000}
    for name in ("unit-ms", "unit-td"):
        broker.schedules.remove(name)
