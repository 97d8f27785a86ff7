"""The broker's settings are checked once, before anything is made: every bad value in one
error, no client built; assigning a setting later goes through the same checks. So are
the connection parameters passed on to redis-py, and each setting is documented."""

from __future__ import annotations

import dataclasses
import inspect
import logging
import re
import time
from pathlib import Path
from typing import Any

import dramatiq
import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from dramatiq_redisson import RedissonBroker
from dramatiq_redisson._settings import BrokerSettings, is_int
from dramatiq_redisson.connection._client import value_problems

#: One bad value per setting, and the words its error must carry.
BAD: list[tuple[str, Any, str]] = [
    ("heartbeat_timeout", -1, "heartbeat_timeout must be a non-negative number, got -1"),
    ("dead_message_ttl", -1, "dead_message_ttl must be a non-negative number"),
    ("transfer_batch_size", 2.5, "transfer_batch_size must be a positive int, got 2.5"),
    ("transfer_batch_size", 8000, "transfer_batch_size must be at most 5000, got 8000"),
    ("safety_interval", "5000", "safety_interval must be a positive number, got '5000'"),
    ("maintenance_interval", 0, "maintenance_interval must be a positive number"),
    ("dedupe_window", -5, "dedupe_window must be a non-negative number"),
    ("transfer_lease", 99, "transfer_lease must be an int of at least 100 ms, got 99"),
    ("wait_for_replicas", True, "wait_for_replicas must be a non-negative int, got True"),
    ("wait_timeout", 0, "wait_timeout must be a positive int, got 0"),
    ("liveness_timeout", 50, "liveness_timeout must be 0 (off) or an int of at least 100 ms, got 50"),
]


@pytest.mark.parametrize(("name", "value", "words"), BAD, ids=[b[0] for b in BAD])
def test_each_bad_value_is_named(name: str, value: Any, words: str) -> None:
    with pytest.raises(ValueError) as raised:
        BrokerSettings(**{name: value})
    assert words in str(raised.value)


def test_every_bad_value_in_one_error_and_no_client_made() -> None:
    """Settings come first: a broker with bad settings and a URL no client could be made
    from names the settings (making a client would have refused the URL first)."""
    with pytest.raises(ValueError, match="scheme"):
        RedissonBroker(url="bogus://nowhere")  # what making the client says
    with pytest.raises(ValueError) as raised:
        RedissonBroker(url="bogus://nowhere", transfer_lease=5, wait_timeout=0, transfer_batch_size=0)
    message = str(raised.value)
    for name in ("transfer_lease", "wait_timeout", "transfer_batch_size"):
        assert name in message
    assert "scheme" not in message


def test_good_values_and_the_defaults() -> None:
    settings = BrokerSettings()
    assert settings.transfer_lease == 2000 and settings.liveness_timeout == 6000
    assert BrokerSettings(liveness_timeout=0, dedupe_window=0, safety_interval=250.5).safety_interval == 250.5
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.safety_interval = 1  # type: ignore[misc]


def test_the_broker_reads_and_checks_its_settings(redis_url: str) -> None:
    broker = RedissonBroker(url=redis_url, safety_interval=2000, transfer_lease=500)
    try:
        assert broker.settings.safety_interval == broker.safety_interval == 2000
        assert broker.transfer_lease == 500
        broker.safety_interval = 1000  # as the tests' fixture does
        assert broker.settings.safety_interval == 1000
        with pytest.raises(ValueError, match="maintenance_interval"):
            broker.maintenance_interval = 0
        assert broker.maintenance_interval == broker.settings.maintenance_interval
        with pytest.raises(AttributeError):
            broker.wait_for_replicas = 1  # the scripts' runner took it when it was built
    finally:
        broker.close()


def test_is_int_refuses_bools_and_floats() -> None:
    assert is_int(0) and is_int(-3)
    assert not is_int(True) and not is_int(1.0) and not is_int("1") and not is_int(None)


# -- the connection parameters passed on to redis-py ------------------------------------

#: One bad value per checked connection parameter, and the words its error must carry.
BAD_CONNECTION: list[tuple[str, Any, str]] = [
    (
        "socket_timeout",
        "abc",
        "socket_timeout must be a positive number of seconds or None (no timeout), got 'abc' (str)",
    ),
    ("socket_connect_timeout", 0, "socket_connect_timeout must be a positive number of seconds or None"),
    ("health_check_interval", "5", "health_check_interval must be a non-negative number of seconds (0: off), got '5'"),
    ("max_connections", "10", "max_connections must be a positive int or None (no limit), got '10' (str)"),
    ("db", "x", "db must be a non-negative int, got 'x' (str)"),
    ("port", "63a9", "port must be an int from 1 to 65535, got '63a9'"),
    ("retry", 3, "retry must be a redis.retry.Retry or None, got 3 (int)"),
    ("retry_on_error", [ValueError, "timeout"], "retry_on_error must be a list of exception classes or None"),
    ("retry_on_timeout", "false", "retry_on_timeout must be True or False (or 1 or 0), got 'false' (str)"),
    ("protocol", 4, "protocol must be 2, 3 or None, got 4"),
]


def _accepted_connections(client: redis.Redis) -> int:
    return int(client.info("stats")["total_connections_received"])


@pytest.mark.parametrize(("name", "value", "words"), BAD_CONNECTION, ids=[b[0] for b in BAD_CONNECTION])
def test_each_bad_connection_parameter_is_named_with_its_value_and_type(name: str, value: Any, words: str) -> None:
    problems = value_problems({name: value})
    assert len(problems) == 1 and words in problems[0]


def test_bad_connection_parameters_are_refused_when_the_broker_is_built(
    redis_url: str, redis_client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    """Before, ``socket_timeout="abc"`` built a broker (with a warning that the client's
    retries could not be bounded) and failed the first send with a TypeError. Now every
    bad value is named in the settings' one ValueError, and nothing connects or writes."""
    keys, accepted = redis_client.keys("*"), _accepted_connections(redis_client)
    with caplog.at_level(logging.WARNING), pytest.raises(ValueError) as raised:
        RedissonBroker(
            url=redis_url,
            socket_timeout="abc",
            health_check_interval="30",
            max_connections=0,
            retry_on_timeout="yes",
            transfer_lease=5,
        )
    message = str(raised.value)
    assert message.startswith("transfer_lease must be an int of at least 100 ms, got 5; ")
    for words in (
        "socket_timeout must be a positive number of seconds or None (no timeout), got 'abc' (str)",
        "health_check_interval must be a non-negative number of seconds (0: off), got '30' (str)",
        "max_connections must be a positive int or None (no limit), got 0 (int)",
        "retry_on_timeout must be True or False (or 1 or 0), got 'yes' (str)",
    ):
        assert words in message
    assert not caplog.records
    assert redis_client.keys("*") == keys and _accepted_connections(redis_client) == accepted
    # Without a url the built-in broker would make the client: refused the same way.
    with pytest.raises(ValueError, match="socket_connect_timeout must be a positive number"):
        RedissonBroker(socket_connect_timeout="2")
    assert _accepted_connections(redis_client) == accepted


def test_good_connection_parameters_pass_and_apply(redis_url: str, redis_client: redis.Redis) -> None:
    retry = Retry(NoBackoff(), 2)
    broker = RedissonBroker(
        url=redis_url,
        socket_timeout=2.5,
        socket_connect_timeout=None,
        health_check_interval=0,
        max_connections=20,
        retry=retry,
        retry_on_error=[redis.ConnectionError],
        retry_on_timeout=True,
        socket_keepalive=None,
        db=0,
        port="6379",  # a string of digits, as redis-py takes it (the url's port wins)
        protocol=2,
    )
    try:
        kwargs = broker.client.connection_pool.connection_kwargs
        assert kwargs["socket_timeout"] == 2.5 and kwargs["retry"] is retry
        noop = dramatiq.actor(lambda: None, actor_name="noop", broker=broker)
        noop.send()
        assert broker.pending("default") == 1
    finally:
        broker.flush_all()
        broker.close()


def test_connection_parameters_with_a_client_are_refused_once(redis_client: redis.Redis) -> None:
    """With ``client=`` the parameters are refused whatever their values: their values are
    not named again."""
    with pytest.raises(ValueError) as raised:
        RedissonBroker(client=redis_client, socket_timeout="abc")
    assert str(raised.value) == (
        "connection parameters given with client= (socket_timeout): the broker would ignore them; "
        "set them on the client you pass"
    )


# -- the settings in the API reference ------------------------------------------------

#: The settings a broker exposes as attributes.
SETTING_ATTRIBUTES = (
    "heartbeat_timeout",
    "dead_message_ttl",
    "transfer_batch_size",
    "safety_interval",
    "maintenance_interval",
    "dedupe_window",
    "transfer_lease",
    "wait_for_replicas",
    "wait_timeout",
)


@pytest.mark.parametrize("name", SETTING_ATTRIBUTES)
def test_each_setting_attribute_says_what_it_means_its_unit_and_its_default(name: str) -> None:
    """The API reference shows these docstrings (before, the settings had none, and the
    constructor's text sent readers to a private class)."""
    doc = getattr(RedissonBroker, name).__doc__ or ""
    default = inspect.signature(RedissonBroker.__init__).parameters[name].default
    assert f"default {default}" in doc
    assert "(ms)" in doc or "(a count)" in doc
    assert len(doc.split()) >= 20  # says what it does, not only its name
    assert "BrokerSettings" not in doc


def test_the_constructor_documents_each_setting_without_sending_readers_to_a_private_class() -> None:
    doc = RedissonBroker.__doc__ or ""
    assert "_settings.BrokerSettings" not in doc
    for name in (*SETTING_ATTRIBUTES, "liveness_timeout"):
        # The entry: its first line and the lines indented under it.
        entry = re.search(rf"\n      {name}: (.*(\n        .*)*)", doc)
        assert entry is not None and "default" in entry[1].lower() and ("ms" in entry[1] or "count" in entry[1]), name


def test_internal_attributes_are_kept_out_of_the_reference() -> None:
    """The broker's internal attributes are documented in the source (``#:`` comments,
    which autodoc would list) and excluded from the API reference by name."""
    page = (Path(__file__).resolve().parent.parent / "docs" / "api" / "broker.md").read_text()
    directive = page.split(".. autoclass:: dramatiq_redisson.RedissonBroker", 1)[1].split(".. ", 1)[0]
    (line,) = [line for line in directive.splitlines() if ":exclude-members:" in line]
    excluded = {name.strip() for name in line.split(":exclude-members:", 1)[1].split(",")}
    assert {"resend_lookup", "client_retry_span", "primary_watch"} <= excluded


def test_the_largest_transfer_batch_moves_in_one_call(broker: RedissonBroker) -> None:
    # (A batch of 7 999 failed every call: Lua unpacks at most about 8 000 values at once.)
    from dramatiq_redisson._settings import MAX_TRANSFER_BATCH_SIZE

    @dramatiq.actor(broker=broker, queue_name="batch")
    def batched(n: int) -> None: ...

    broker.enqueue_many([batched.message(n) for n in range(MAX_TRANSFER_BATCH_SIZE)], delay=50)
    time.sleep(0.1)
    keys = broker.keys("batch")
    moved = broker.redisson_scripts.transfer(
        keys, limit=MAX_TRANSFER_BATCH_SIZE, trim_budget=0, compact_step=0, compact_slack=0, window_ms=120_000
    ).moved
    assert moved == MAX_TRANSFER_BATCH_SIZE
