"""A message option whose name looks misspelt (``send_with_options(dela=5000)``) is sent as
it is, as Dramatiq passes unknown options on, but the broker warns once per actor and
option with the closest name an option of Dramatiq, the broker or one of its middleware
has (issue 56). Options a middleware declares, the broker's own and custom options far
from every known name pass silently."""

from __future__ import annotations

import logging

import dramatiq
import pytest
import redis
from dramatiq import Actor
from dramatiq.middleware import Middleware

from dramatiq_redisson import RedissonBroker


def option_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The texts of the option warnings logged so far, by the broker's logger."""
    return [
        record.getMessage()
        for record in caplog.records
        if record.levelno == logging.WARNING
        and record.name == "dramatiq_redisson.RedissonBroker"
        and "message option" in record.getMessage()
    ]


def test_a_misspelt_option_is_sent_as_given_and_warned_of_once_per_actor(
    broker: RedissonBroker, stamp: Actor[[int | None], None], caplog: pytest.LogCaptureFixture
) -> None:
    """``dela=5000`` went as an option named ``dela`` and the message ran at once, with
    nothing said."""
    with caplog.at_level(logging.WARNING):
        first = stamp.send_with_options(args=(1,), dela=5000)
        stamp.send_with_options(args=(2,), dela=5000)
    (warning,) = option_warnings(caplog)
    assert "'stamp'" in warning and "'dela'" in warning and "did you mean 'delay'?" in warning
    # Sent as given: an immediate message carrying the option.
    assert first.options["dela"] == 5000 and "eta" not in first.options
    assert broker.pending("default") == 2

    @dramatiq.actor(max_retries=0)
    def other() -> None:
        pass

    with caplog.at_level(logging.WARNING):
        other.send_with_options(dela=5000)  # another actor: warned of once more
    assert len(option_warnings(caplog)) == 2 and "'other'" in option_warnings(caplog)[1]


def test_a_misspelt_option_of_a_bulk_send_is_warned_of(
    broker: RedissonBroker, stamp: Actor[[int | None], None], caplog: pytest.LogCaptureFixture
) -> None:
    messages = [stamp.message_with_options(args=(i,), time_limt=1000) for i in range(3)]
    with caplog.at_level(logging.WARNING):
        broker.enqueue_many(messages)
    (warning,) = option_warnings(caplog)
    assert "'time_limt'" in warning and "did you mean 'time_limit'?" in warning
    assert broker.pending("default") == 3


def test_known_options_and_custom_ones_pass_silently(
    broker: RedissonBroker,
    stamp: Actor[[int | None], None],
    redis_client: redis.Redis,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """``delay`` (a send's argument, and a message option of Dramatiq's pipelines), the
    broker's own options, Dramatiq's and a custom option close to none of them."""
    with caplog.at_level(logging.WARNING):
        stamp.send_with_options(args=(1,), delay=60_000)
        broker.enqueue(stamp.message_with_options(args=(2,), delay=60_000), delay=60_000)
        stamp.send_with_options(args=(3,), delay=60_000, dedupe_key="k", dedupe="replace", dedupe_ttl=10)
        stamp.send_with_options(args=(4,), broker_priority=0, max_retries=3, time_limit=1000, on_success=None)
        stamp.send_with_options(args=(5,), tenant="acme", request_id="r-1")
    assert option_warnings(caplog) == []


class TenantMiddleware(Middleware):
    """A third-party middleware that declares its own actor options."""

    @property
    def actor_options(self) -> set[str]:
        return {"my_opt", "result_ttl_ms"}


def test_options_a_middleware_declares_pass_and_are_suggested(
    broker: RedissonBroker, stamp: Actor[[int | None], None], caplog: pytest.LogCaptureFixture
) -> None:
    """Added after the first sends: the known names are gathered again."""
    with caplog.at_level(logging.WARNING):
        stamp.send_with_options(args=(1,))
        broker.add_middleware(TenantMiddleware())
        # result_ttl_ms is close to Dramatiq's result_ttl, but this middleware reads it.
        stamp.send_with_options(args=(2,), my_opt=1, result_ttl_ms=5)
        assert option_warnings(caplog) == []
        stamp.send_with_options(args=(3,), my_op=1)
    (warning,) = option_warnings(caplog)
    assert "'my_op'" in warning and "did you mean 'my_opt'?" in warning
    assert broker.pending("default") == 3


def test_a_retry_carries_its_options_unchecked(
    broker: RedissonBroker, redis_client: redis.Redis, caplog: pytest.LogCaptureFixture, make_worker: object
) -> None:
    """A retry (Retries re-enqueues the message being processed) adds ``retries`` and
    ``traceback`` to the options its first send was checked with: nothing to warn of."""

    @dramatiq.actor(max_retries=1, min_backoff=10, max_backoff=10)
    def flaky() -> None:
        if redis_client.incr("test:flaky") == 1:
            raise RuntimeError("first run fails")

    with caplog.at_level(logging.WARNING):
        flaky.send()
        make_worker()  # type: ignore[operator]
        broker.join(flaky.queue_name, timeout=10_000)
    assert int(redis_client.get("test:flaky") or 0) == 2
    assert option_warnings(caplog) == []
