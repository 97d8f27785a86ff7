"""The TLS proxy itself (``tls_proxy.py``): what ``tests/connection/test_tls.py`` relies on when it
checks the broker over ``rediss://``: bytes reach the plain server and come back, the
proxy records each handshaken connection and what its client sent, a client that does
not trust the proxy's CA is refused and leaves no record, and ``stop()`` frees the port."""

from __future__ import annotations

import socket
import ssl
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from .tls_proxy import Certificates, TLSProxy, make_certificates, tls_proxy, tls_url, upstream_address


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    return make_certificates(tmp_path_factory.mktemp("tls-proxy"))


@pytest.fixture
def proxy(redis_url: str, certs: Certificates) -> Iterator[TLSProxy]:
    with tls_proxy(redis_url, certs.server_context()) as p:
        yield p


def _client(url: str, ca_file: Path) -> redis.Redis:
    return redis.Redis.from_url(url, ssl_ca_certs=str(ca_file), socket_timeout=5)


def test_commands_go_through_and_the_connection_is_recorded(
    redis_url: str, proxy: TLSProxy, certs: Certificates
) -> None:
    client = _client(tls_url(redis_url, proxy), certs.ca_file)
    try:
        assert client.set("harness:tls", "through") is True
        assert client.get("harness:tls") == b"through"
        assert client.delete("harness:tls") == 1
    finally:
        client.close()
    [conn] = proxy.connections_that_sent(b"SET")
    assert conn.handshake_ok
    assert b"harness:tls" in bytes(conn.sent)
    assert b"through" in bytes(conn.received)
    assert proxy.connections_that_sent(b"SUBSCRIBE") == []


def test_a_client_that_does_not_trust_the_ca_is_refused_and_the_failure_recorded(
    redis_url: str, proxy: TLSProxy, certs: Certificates
) -> None:
    client = _client(tls_url(redis_url, proxy), certs.other_ca_file)
    try:
        with pytest.raises(redis.ConnectionError, match="CERTIFICATE_VERIFY_FAILED|certificate verify failed"):
            client.ping()
    finally:
        client.close()
    # A refused handshake never reaches the proxy's handler: nothing recorded, nothing forwarded.
    assert proxy.snapshot() == []


def test_stop_frees_the_port(redis_url: str, certs: Certificates) -> None:
    with tls_proxy(redis_url, certs.server_context()) as p:
        port = p.port
        assert port > 0
        client = _client(tls_url(redis_url, p), certs.ca_file)
        assert client.ping()
        client.close()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()


def test_urls_keep_credentials_and_database_and_only_plain_upstreams_are_taken(certs: Certificates) -> None:
    proxy = TLSProxy("127.0.0.1", 1, ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER))
    proxy.port = 4321
    assert tls_url("redis://u:p@127.0.0.1:6000/3", proxy, ssl_cert_reqs="required") == (
        "rediss://u:p@127.0.0.1:4321/3?ssl_cert_reqs=required"
    )
    assert tls_url("redis://127.0.0.1:6000", proxy) == "rediss://127.0.0.1:4321/0"
    assert upstream_address("redis://localhost:6001/2") == ("localhost", 6001)
    with pytest.raises(ValueError, match="plain"):
        upstream_address("rediss://127.0.0.1:6000")
