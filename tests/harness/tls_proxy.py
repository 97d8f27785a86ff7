"""A small TLS-terminating TCP proxy for the tests: TLS on a free loopback port in
front of the session's plain Redis server.

The embedded Valkey is built without TLS, so ``rediss://`` is tested through this
proxy: clients speak TLS to the proxy, which forwards the decrypted bytes to the plain
server. It runs an asyncio loop in a daemon thread of the test process and records each
connection whose TLS handshake completed, with what its client sent (so a test can tell
which connection carried ``SUBSCRIBE``); a refused handshake leaves no record.

Certificates come from ``trustme``: a throwaway CA and a server certificate for
``127.0.0.1`` and ``localhost``.
"""

from __future__ import annotations

import asyncio
import ssl
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlencode, urlsplit, urlunsplit

import trustme

from dramatiq_redisson.embedded import free_loopback_port

#: Bytes of client traffic kept per connection (enough to see its first commands).
RECORD_LIMIT = 1 << 16


@dataclass
class ProxiedConnection:
    """One connection the proxy accepted."""

    peer: str
    handshake_ok: bool = False
    client_cert_subject: object = None
    sent: bytearray = field(default_factory=bytearray)  # client -> server, first RECORD_LIMIT bytes
    received: bytearray = field(default_factory=bytearray)  # server -> client, first RECORD_LIMIT bytes
    closed: bool = False


class TLSProxy:
    """TLS on ``127.0.0.1:<port>`` forwarded to ``upstream_host:upstream_port`` in plain TCP.

    Use as a context manager (or :meth:`start` / :meth:`stop`). ``server_context`` is
    the server side's :class:`ssl.SSLContext` (certificate loaded; set
    ``verify_mode`` to require client certificates)."""

    def __init__(self, upstream_host: str, upstream_port: int, server_context: ssl.SSLContext) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.context = server_context
        self.host = "127.0.0.1"
        self.port = 0
        self.connections: list[ProxiedConnection] = []
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.base_events.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._ready = threading.Event()
        self._start_error: BaseException | None = None

    # -- lifecycle ---------------------------------------------------------------

    def start(self) -> TLSProxy:
        self._thread = threading.Thread(target=self._run, name="tls-proxy", daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the TLS proxy did not start within 10 s")
        if self._start_error is not None:
            raise RuntimeError("the TLS proxy could not start") from self._start_error
        return self

    def stop(self) -> None:
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        asyncio.run_coroutine_threadsafe(self._shutdown(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        self._loop = self._thread = None

    def __enter__(self) -> TLSProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- what the proxy saw ------------------------------------------------------

    def snapshot(self) -> list[ProxiedConnection]:
        with self._lock:
            return list(self.connections)

    def connections_that_sent(self, command: bytes) -> list[ProxiedConnection]:
        """Handshaken connections whose client sent ``command`` (as a RESP bulk string)."""
        needle = b"\r\n" + command.upper() + b"\r\n"
        return [c for c in self.snapshot() if c.handshake_ok and needle in bytes(c.sent).upper()]

    # -- the loop ----------------------------------------------------------------

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            for attempt in range(3):
                port = free_loopback_port()
                try:
                    self._server = loop.run_until_complete(
                        asyncio.start_server(self._handle, self.host, port, ssl=self.context, ssl_handshake_timeout=5)
                    )
                    self.port = port
                    break
                except OSError as e:  # the port was taken meanwhile: try another
                    if attempt == 2:
                        self._start_error = e
        except BaseException as e:  # pragma: no cover - reported by start()
            self._start_error = e
        self._ready.set()
        if self._start_error is None:
            loop.run_forever()
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()

    async def _shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        peer = writer.get_extra_info("peername")
        record = ProxiedConnection(peer=f"{peer[0]}:{peer[1]}" if peer else "?")
        # start_server only calls us once the handshake is done.
        record.handshake_ok = writer.get_extra_info("ssl_object") is not None
        record.client_cert_subject = writer.get_extra_info("peercert")
        with self._lock:
            self.connections.append(record)
        upstream_writer: asyncio.StreamWriter | None = None
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(*self.upstream)
            await asyncio.gather(
                self._pump(reader, upstream_writer, record.sent), self._pump(upstream_reader, writer, record.received)
            )
        except (asyncio.CancelledError, ConnectionError, OSError, ssl.SSLError):
            pass
        finally:
            record.closed = True
            for w in (writer, upstream_writer):
                if w is not None:
                    w.close()
                    try:
                        await w.wait_closed()
                    except (asyncio.CancelledError, ConnectionError, OSError, ssl.SSLError):
                        pass
            self._tasks.discard(task)

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, record: bytearray) -> None:
        try:
            while True:
                data = await reader.read(65536)
                if not data:
                    break
                if len(record) < RECORD_LIMIT:
                    record.extend(data[: RECORD_LIMIT - len(record)])
                writer.write(data)
                await writer.drain()
        finally:
            # One side closed: close the other, so the peer sees the end too.
            writer.close()


@dataclass
class Certificates:
    """Files of a throwaway PKI for one test session."""

    ca: trustme.CA
    ca_file: Path  # the CA that signed the server (and client) certificate
    other_ca_file: Path  # a CA that signed nothing the proxy presents
    client_cert_file: Path  # a client certificate + key (one PEM) signed by ``ca``
    server_cert: trustme.LeafCert

    def server_context(self, *, require_client_cert: bool = False) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.server_cert.configure_cert(context)
        if require_client_cert:
            context.verify_mode = ssl.CERT_REQUIRED
            self.ca.configure_trust(context)
        return context


def make_certificates(directory: Path) -> Certificates:
    ca = trustme.CA()
    other = trustme.CA()
    server_cert = ca.issue_cert("127.0.0.1", "localhost")
    client_cert = ca.issue_cert("dramatiq-redisson-worker@example.invalid")
    certs = Certificates(
        ca=ca,
        ca_file=directory / "ca.pem",
        other_ca_file=directory / "other-ca.pem",
        client_cert_file=directory / "client.pem",
        server_cert=server_cert,
    )
    ca.cert_pem.write_to_path(str(certs.ca_file))
    other.cert_pem.write_to_path(str(certs.other_ca_file))
    client_cert.private_key_and_cert_chain_pem.write_to_path(str(certs.client_cert_file))
    return certs


def upstream_address(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    if parts.scheme != "redis" or parts.hostname is None:
        raise ValueError(f"the TLS proxy needs a plain redis://host:port upstream, not {url!r}")
    return parts.hostname, parts.port or 6379


def tls_url(upstream_url: str, proxy: TLSProxy, **query: str) -> str:
    """``upstream_url`` (credentials and database kept) as ``rediss://`` to the proxy."""
    parts = urlsplit(upstream_url)
    userinfo = parts.netloc.rpartition("@")[0]
    netloc = f"{userinfo}@" if userinfo else ""
    netloc += f"{proxy.host}:{proxy.port}"
    return urlunsplit(("rediss", netloc, parts.path or "/0", urlencode(query), ""))


@contextmanager
def tls_proxy(upstream_url: str, context: ssl.SSLContext) -> Iterator[TLSProxy]:
    host, port = upstream_address(upstream_url)
    with TLSProxy(host, port, context) as proxy:
        yield proxy
