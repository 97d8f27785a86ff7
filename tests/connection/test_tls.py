"""``rediss://`` with certificate verification, for commands and the pub/sub subscription.

The embedded Valkey has no TLS, so these tests put :mod:`tests.harness.tls_proxy` (TLS with a
``trustme`` CA on a free loopback port) in front of the session's plain server.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import dramatiq
import pytest
import redis
from dramatiq import Worker
from dramatiq.middleware import default_middleware

from dramatiq_redisson import RedissonBroker
from tests.harness.tls_proxy import Certificates, TLSProxy, make_certificates, tls_proxy, tls_url

#: The timer's safety interval in these tests: far longer than any wait below, so a
#: delayed message that runs promptly was moved because its announcement reached the
#: consumer's subscription, not by the periodic transfer.
SAFETY_INTERVAL = 60_000


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    return make_certificates(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def proxy(redis_url: str, certs: Certificates) -> Iterator[TLSProxy]:
    with tls_proxy(redis_url, certs.server_context()) as p:
        yield p


@pytest.fixture(scope="module")
def mtls_proxy(redis_url: str, certs: Certificates) -> Iterator[TLSProxy]:
    """A proxy that also requires a client certificate signed by the test CA."""
    with tls_proxy(redis_url, certs.server_context(require_client_cert=True)) as p:
        yield p


@pytest.fixture
def brokers() -> Iterator[list[RedissonBroker]]:
    made: list[RedissonBroker] = []
    yield made
    for b in made:
        b.close()


def _ssl_connections(broker: RedissonBroker) -> None:
    pool = broker.client.connection_pool
    assert issubclass(pool.connection_class, redis.SSLConnection), pool.connection_class


def test_worker_runs_immediate_and_delayed_messages_over_tls(
    redis_url: str,
    redis_client: redis.Redis,
    proxy: TLSProxy,
    certs: Certificates,
    brokers: list[RedissonBroker],
) -> None:
    # The URL query form: redis-py's parse_url passes unknown query arguments through
    # as strings, and SSLConnection accepts "required" for ssl_cert_reqs.
    url = tls_url(redis_url, proxy, ssl_ca_certs=str(certs.ca_file), ssl_cert_reqs="required")
    broker = RedissonBroker(url=url, middleware=[m() for m in default_middleware])
    brokers.append(broker)
    broker.safety_interval = SAFETY_INTERVAL
    dramatiq.set_broker(broker)
    _ssl_connections(broker)
    ran: dict[str, float] = {}
    done = threading.Event()

    @dramatiq.actor(queue_name="tls", max_retries=0)
    def job(name: str) -> None:
        ran[name] = time.monotonic()
        if len(ran) == 2:
            done.set()

    before = len(proxy.snapshot())
    worker = Worker(broker, worker_timeout=100, worker_threads=2)
    worker.start()
    try:
        job.send("now")
        deadline = time.monotonic() + 10
        while not proxy.connections_that_sent(b"SUBSCRIBE") and time.monotonic() < deadline:
            time.sleep(0.02)
        subscribed = [c for c in proxy.connections_that_sent(b"SUBSCRIBE") if b"{dramatiq:tls}" in c.sent]
        assert subscribed, "the consumer's SUBSCRIBE never went through the TLS proxy"
        while "now" not in ran and time.monotonic() < deadline:
            time.sleep(0.02)
        assert "now" in ran, "the immediate message did not run over TLS"

        sent_at = time.monotonic()
        job.send_with_options(args=("later",), delay=300)
        assert done.wait(10), f"the delayed message did not run (ran: {sorted(ran)})"
        broker.join("tls", timeout=5000)
    finally:
        worker.stop()

    late_by = ran["later"] - sent_at
    # Due after 300 ms; the next periodic transfer would come after 60 s.
    assert 0.29 <= late_by < 5, late_by
    # The announcement reached the consumer over the TLS subscription (the consumer's,
    # not the permission probe's short-lived SUBSCRIBE/UNSUBSCRIBE).
    subscribed = [c for c in proxy.connections_that_sent(b"SUBSCRIBE") if b"{dramatiq:tls}" in c.sent]
    assert any(b"message" in c.received and b"{dramatiq:tls}" in c.received for c in subscribed)
    # Every connection the broker opened went through the proxy and completed a handshake.
    opened = proxy.snapshot()[before:]
    assert opened and all(c.handshake_ok for c in opened)
    assert any(b"EVALSHA" in c.sent for c in opened)
    # Nothing leaked into the plain server's view of the queue.
    assert redis_client.llen("dramatiq:tls") == 0
    assert redis_client.zcard("redisson_delay_queue_timeout:{dramatiq:tls}") == 0


def test_connection_parameters_form(
    redis_url: str, proxy: TLSProxy, certs: Certificates, brokers: list[RedissonBroker]
) -> None:
    """Without ``url``: ``ssl=True`` and ``ssl_ca_certs`` go to ``redis.Redis``."""
    broker = RedissonBroker(host=proxy.host, port=proxy.port, ssl=True, ssl_ca_certs=str(certs.ca_file))
    brokers.append(broker)
    _ssl_connections(broker)
    _offer_and_cancel(broker)


def test_url_with_connection_parameters_form(
    redis_url: str, proxy: TLSProxy, certs: Certificates, brokers: list[RedissonBroker]
) -> None:
    """``url="rediss://…"`` with ``ssl_ca_certs=`` as a keyword: the parameters apply
    (the built-in broker drops them when given a url, so verification would fail)."""
    broker = RedissonBroker(url=tls_url(redis_url, proxy), ssl_ca_certs=str(certs.ca_file))
    brokers.append(broker)
    _ssl_connections(broker)
    _offer_and_cancel(broker)


def test_client_form(redis_url: str, proxy: TLSProxy, certs: Certificates, brokers: list[RedissonBroker]) -> None:
    """``client=redis.Redis.from_url(url, ssl_ca_certs=...)``: keyword arguments of
    ``from_url`` do reach the connections."""
    client = redis.Redis.from_url(tls_url(redis_url, proxy), ssl_ca_certs=str(certs.ca_file))
    try:
        broker = RedissonBroker(client=client)
        brokers.append(broker)
        _ssl_connections(broker)
        _offer_and_cancel(broker)
    finally:
        client.close()


def test_client_certificate(
    redis_url: str, mtls_proxy: TLSProxy, certs: Certificates, brokers: list[RedissonBroker]
) -> None:
    """Mutual TLS: ``ssl_certfile`` (a PEM with key and chain; ``ssl_keyfile`` when the
    key is a separate file) in the URL."""
    url = tls_url(redis_url, mtls_proxy, ssl_ca_certs=str(certs.ca_file), ssl_certfile=str(certs.client_cert_file))
    broker = RedissonBroker(url=url)
    brokers.append(broker)
    _offer_and_cancel(broker)
    pubsub = broker.client.pubsub()
    try:
        pubsub.subscribe(broker.keys("mtls").channel)
        assert _next_message(pubsub)["type"] == "subscribe"
    finally:
        pubsub.close()
    assert any(c.client_cert_subject for c in mtls_proxy.snapshot())

    # Without a client certificate the proxy refuses the handshake.
    anonymous = RedissonBroker(url=tls_url(redis_url, mtls_proxy, ssl_ca_certs=str(certs.ca_file)))
    brokers.append(anonymous)
    with pytest.raises(redis.ConnectionError):
        anonymous.client.ping()


def test_wrong_ca_fails_fast_with_a_verification_error(
    redis_url: str, proxy: TLSProxy, certs: Certificates, brokers: list[RedissonBroker]
) -> None:
    url = tls_url(redis_url, proxy, ssl_ca_certs=str(certs.other_ca_file), ssl_cert_reqs="required")
    broker = RedissonBroker(url=url, middleware=[m() for m in default_middleware])
    brokers.append(broker)
    handshaken = sum(c.handshake_ok for c in proxy.snapshot())

    @dramatiq.actor(queue_name="tls-bad", broker=broker)
    def job() -> None:  # pragma: no cover - never runs
        pass

    for operation in (lambda: job.send(), lambda: job.send_with_options(delay=1000)):
        started = time.monotonic()
        with pytest.raises(redis.ConnectionError) as info:
            operation()
        assert time.monotonic() - started < 10
        assert "certificate verify failed" in str(info.value).lower(), info.value

    # The subscription fails the same way, without hanging.
    pubsub = broker.client.pubsub()
    try:
        with pytest.raises(redis.ConnectionError, match="(?i)certificate verify failed"):
            pubsub.subscribe(broker.keys("tls-bad").channel)
    finally:
        pubsub.close()
    # A worker on it keeps failing (and logging) without hanging, and stops promptly.
    worker = Worker(broker, worker_timeout=100, worker_threads=1)
    worker.start()
    try:
        time.sleep(0.5)
    finally:
        started = time.monotonic()
        worker.stop()
    assert time.monotonic() - started < 10
    assert sum(c.handshake_ok for c in proxy.snapshot()) == handshaken


def test_verification_is_on_by_default_for_rediss(
    redis_url: str, proxy: TLSProxy, brokers: list[RedissonBroker]
) -> None:
    """``rediss://`` without a CA verifies against the system store, which does not
    trust the test CA: no silent fallback to an unverified connection."""
    broker = RedissonBroker(url=tls_url(redis_url, proxy))
    brokers.append(broker)
    with pytest.raises(redis.ConnectionError, match="(?i)certificate verify failed"):
        broker.enqueue(_message("tls-default"))


def _message(queue_name: str) -> dramatiq.Message[Any]:
    return dramatiq.Message(queue_name=queue_name, actor_name="nothing", args=(), kwargs={}, options={})


def _offer_and_cancel(broker: RedissonBroker) -> None:
    message = broker.enqueue(_message("tls-ops"), delay=60_000)
    queue = broker.delayed_queue("tls-ops")
    try:
        assert queue.contains(message.message_id)
        assert queue.remove(message.message_id)
        assert queue.size() == 0
    finally:
        broker.flush("tls-ops")


def _next_message(pubsub: Any, timeout: float = 5) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        item = pubsub.get_message(timeout=0.1)
        if item is not None:
            return dict(item)
    raise AssertionError("no pub/sub reply")
