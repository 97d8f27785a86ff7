"""Back-off logic, with the waits recorded instead of slept: how long a client may retry one
command (``client_retry_span_ms``, which bounds the producer's resend window), and the
consumer's back-off after failed calls (doubling with jitter from 100-200 ms to 1-2 s, LOADING
asked again within a probe interval, reset by a call that works)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis
from redis.backoff import ConstantBackoff, DecorrelatedJitterBackoff, ExponentialBackoff, NoBackoff
from redis.retry import Retry

from dramatiq_redisson import RedissonBroker
from dramatiq_redisson._backoff import ERROR_BACKOFF_FACTOR, MAX_ERROR_BACKOFF, PROBE_INTERVAL
from dramatiq_redisson._consumer import RedissonConsumer
from dramatiq_redisson.connection._client import client_retry_span_ms


def _client(retry: Retry, *, socket_timeout: float | None = 2.0, connect_timeout: float | None = 1.0) -> redis.Redis:
    # Never connected: the span is read from the settings alone.
    return redis.Redis(
        host="127.0.0.1", port=1, retry=retry, socket_timeout=socket_timeout, socket_connect_timeout=connect_timeout
    )


# -- how long one command may be retried ------------------------------------------------


def test_a_client_that_does_not_retry_has_no_span() -> None:
    assert client_retry_span_ms(_client(Retry(NoBackoff(), 0))) == 0


def test_a_client_that_retries_forever_has_no_bound() -> None:
    assert client_retry_span_ms(_client(Retry(NoBackoff(), -1))) is None


def test_the_span_is_every_attempts_timeouts_plus_the_longest_pauses() -> None:
    # First attempt: a socket timeout (2 s); each of 3 retries: connect (1 s) + socket (2 s);
    # pauses: min(cap, base * 2^n) for n = 1..3 = 0.2 + 0.4 + 0.5 s.
    retry = Retry(ExponentialBackoff(cap=0.5, base=0.1), 3)
    assert client_retry_span_ms(_client(retry)) == 2000 + 3 * 3000 + 1100


def test_a_constant_backoff_pauses_its_value_each_retry() -> None:
    assert client_retry_span_ms(_client(Retry(ConstantBackoff(0.25), 2))) == 2000 + 2 * 3000 + 500


def test_a_decorrelated_jitter_backoff_counts_its_cap_each_retry() -> None:
    retry = Retry(DecorrelatedJitterBackoff(cap=0.8, base=0.1), 2)
    assert client_retry_span_ms(_client(retry)) == 2000 + 2 * 3000 + 1600


def test_a_client_without_socket_timeouts_waits_for_replies_instead_of_timing_out() -> None:
    retry = Retry(ConstantBackoff(0.1), 2)
    assert client_retry_span_ms(_client(retry, socket_timeout=None, connect_timeout=None)) == 200


# -- the consumer's back-off after failed calls -----------------------------------------


class RecordedWaits:
    """Stands in for the consumer's wake-up event: records each wait asked for, returns at once."""

    def __init__(self) -> None:
        self.waits: list[float] = []

    def wait(self, timeout: float | None = None) -> bool:
        assert timeout is not None
        self.waits.append(timeout)
        return False

    def set(self) -> None:
        pass

    def clear(self) -> None:
        pass

    def is_set(self) -> bool:
        return False


@pytest.fixture
def consumer(broker: RedissonBroker) -> Iterator[RedissonConsumer]:
    broker.declare_queue("default")
    consumer = broker.consume("default", prefetch=1, timeout=1000)
    assert isinstance(consumer, RedissonConsumer)
    consumer.failures.wakeup = RecordedWaits()  # type: ignore[assignment]
    yield consumer
    consumer.close()


def _ladder(attempt: int) -> tuple[float, float]:
    """The bounds of the wait (s) after the ``attempt``-th failure in a row (Dramatiq's
    ``compute_backoff``): one to two times factor x 2^(attempt - 1); past the cap, half
    the cap to the cap."""
    base = ERROR_BACKOFF_FACTOR * 2 ** (attempt - 1)
    return min(base, MAX_ERROR_BACKOFF / 2) / 1000, min(2 * base, MAX_ERROR_BACKOFF) / 1000


def test_failed_calls_back_off_doubling_to_the_cap_and_a_working_call_resets_it(consumer: RedissonConsumer) -> None:
    waits: RecordedWaits = consumer.failures.wakeup  # type: ignore[assignment]
    for _ in range(9):
        consumer._failed(redis.ResponseError("ERR something the server refused"))
    assert len(waits.waits) == 9
    for attempt, waited in enumerate(waits.waits, start=1):
        low, high = _ladder(attempt)
        assert low <= waited <= high, (attempt, waited)
    assert max(waits.waits) <= MAX_ERROR_BACKOFF / 1000
    assert waits.waits[-1] >= MAX_ERROR_BACKOFF / 2000  # at the cap

    consumer.failures.recovered()
    consumer._failed(redis.ResponseError("ERR again"))
    low, high = _ladder(1)
    assert low <= waits.waits[-1] <= high


def test_a_loading_server_is_asked_again_within_a_probe_interval_whatever_the_back_off(
    consumer: RedissonConsumer,
) -> None:
    waits: RecordedWaits = consumer.failures.wakeup  # type: ignore[assignment]
    for _ in range(6):
        consumer._failed(redis.BusyLoadingError("LOADING Redis is loading the dataset in memory"))
    assert all(w <= PROBE_INTERVAL / 1000 for w in waits.waits), waits.waits
    assert consumer.failures.calls.attempts == 6  # the ladder still climbs: a later error of another kind backs off


def test_a_lost_connection_backs_off_but_probes_the_server_meanwhile(consumer: RedissonConsumer) -> None:
    # The session server accepts connections: the probe says so, and the wait is cut into
    # probe intervals (ended early only after the server was seen down).
    waits: RecordedWaits = consumer.failures.wakeup  # type: ignore[assignment]
    consumer.failures.calls.attempts = 5  # the next back-off is 1-2 s
    consumer._failed(redis.ConnectionError("Connection reset by peer"))
    assert waits.waits, "no wait"
    assert all(w <= PROBE_INTERVAL / 1000 + 1e-9 for w in waits.waits), waits.waits
    assert consumer.failures.server_was_down is False
