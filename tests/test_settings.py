"""The broker's settings are checked once, before anything is made: every bad value in one
error, no client built; assigning a setting later goes through the same checks."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from dramatiq_redisson import RedissonBroker
from dramatiq_redisson._settings import BrokerSettings, is_int

#: One bad value per setting, and the words its error must carry.
BAD: list[tuple[str, Any, str]] = [
    ("heartbeat_timeout", -1, "heartbeat_timeout must be a non-negative number, got -1"),
    ("dead_message_ttl", -1, "dead_message_ttl must be a non-negative number"),
    ("transfer_batch_size", 2.5, "transfer_batch_size must be a positive int, got 2.5"),
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
