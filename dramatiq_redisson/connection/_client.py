"""The redis client a broker makes, how long it may retry one command, and a probe that
tells when a server that went away accepts connections again.

A broker given a ``url`` (or ``cluster=True``) makes its own client, with every connection
parameter applied; :func:`argument_problems` refuses, before that, a keyword argument
neither the broker nor redis-py takes (the names read from redis-py itself, see
:func:`connection_parameter_names`) and a value of the wrong type for a parameter
whose type is plain (:func:`value_problems`), and :func:`make_client` turns ``cluster=True``
against a server without cluster mode into an error that says what to change.
:func:`client_retry_span_ms` bounds how long that client (or one passed in) may retry a
command, which sizes the broker's ``dedupe_window``; :func:`close_client` closes what the
broker opened. :func:`connect` is the broker's start: the client it was given or one it
makes. :func:`server_address` names where a client connects, for log lines.
:class:`Probe` is the consumers' cheap check, while the server is away, of whether it is
back.
"""

from __future__ import annotations

import difflib
import functools
import inspect
import math
import socket
from collections.abc import Callable, Collection, Mapping
from typing import TYPE_CHECKING, Any, cast

import redis
import redis.cluster
from redis.cluster import RedisCluster
from redis.connection import ConnectionPool
from redis.exceptions import RedisClusterException
from redis.retry import Retry

from .._keys import check_cluster_name
from .._settings import is_int

if TYPE_CHECKING:
    from typing_extensions import TypeIs


def _keyword_names(*classes: type) -> set[str]:
    """The named keyword parameters of the ``__init__`` of ``classes`` and of their bases
    (a connection class passes ``**kwargs`` up to its base)."""
    keyword = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    names: set[str] = set()
    for cls in classes:
        for klass in cls.__mro__:
            init = klass.__dict__.get("__init__")
            if init is None or klass is object:
                continue
            try:
                parameters = inspect.signature(init).parameters.values()
            except (TypeError, ValueError):  # a C-level __init__: nothing to read
                continue
            names.update(p.name for p in parameters if p.kind in keyword and p.name != "self")
    names.discard("url")  # the broker's own
    return names


@functools.cache
def connection_parameter_names(cluster: bool) -> frozenset[str]:
    """Every keyword argument redis-py's client for one server (``cluster=False``) or for a
    cluster takes, read from redis-py itself so that the list follows its version.

    One server: the named parameters of ``Redis``, of ``ConnectionPool`` (``Redis.from_url``
    passes its keywords to it) and of the connection classes and their bases. A cluster:
    those too (its nodes' clients get them), ``RedisCluster``'s and the names it passes on
    to its nodes (``redis.cluster.REDIS_ALLOWED_KEYS``)."""
    names = _keyword_names(
        redis.Redis, ConnectionPool, redis.Connection, redis.SSLConnection, redis.UnixDomainSocketConnection
    )
    if cluster:
        names |= _keyword_names(RedisCluster) | set(getattr(redis.cluster, "REDIS_ALLOWED_KEYS", ()))
    return frozenset(names)


def _number(value: object) -> TypeIs[int | float]:
    """An int or a float that is not a bool (``True`` is an int to Python)."""
    return isinstance(value, int | float) and not isinstance(value, bool)


def _is_switch(value: object) -> bool:
    """True or False, or 1 or 0 (redis-py takes any truthy value; a text such as "false",
    read from the environment, would be true there and is refused here)."""
    return isinstance(value, bool) or (isinstance(value, int) and value in (0, 1))


def _retry_errors(value: object) -> bool:
    """A list or tuple of exception classes, as redis-py's ``retry_on_error`` takes."""
    return isinstance(value, list | tuple) and all(
        isinstance(error, type) and issubclass(error, BaseException) for error in value
    )


#: The connection parameters whose values the broker checks before it makes a client, and
#: what each must be: those whose wrong type redis-py would only meet at the first command
#: (a TypeError deep in a send, or a retry span that cannot be bounded). Each value is
#: ``(test, what it must be)``; a value redis-py converts itself passes (``port`` may be a
#: string of digits).
_VALUE_CHECKS: dict[str, tuple[Callable[[object], bool], str]] = {
    "socket_timeout": (
        lambda v: v is None or (_number(v) and v > 0),
        "a positive number of seconds or None (no timeout)",
    ),
    "socket_connect_timeout": (
        lambda v: v is None or (_number(v) and v > 0),
        "a positive number of seconds or None (no timeout)",
    ),
    "health_check_interval": (lambda v: _number(v) and v >= 0, "a non-negative number of seconds (0: off)"),
    "max_connections": (lambda v: v is None or (is_int(v) and v > 0), "a positive int or None (no limit)"),
    "socket_read_size": (lambda v: is_int(v) and v > 0, "a positive int (bytes)"),
    "db": (lambda v: is_int(v) and v >= 0, "a non-negative int"),
    "port": (
        lambda v: (is_int(v) and 0 < v < 65536) or (isinstance(v, str) and v.isdigit() and 0 < int(v) < 65536),
        "an int from 1 to 65535",
    ),
    "retry": (lambda v: v is None or isinstance(v, Retry), "a redis.retry.Retry or None"),
    "retry_on_error": (lambda v: v is None or _retry_errors(v), "a list of exception classes or None"),
    "retry_on_timeout": (_is_switch, "True or False (or 1 or 0)"),
    "socket_keepalive": (lambda v: v is None or _is_switch(v), "True, False (or 1 or 0) or None"),
    "single_connection_client": (_is_switch, "True or False (or 1 or 0)"),
    "ssl": (_is_switch, "True or False (or 1 or 0)"),
    "decode_responses": (_is_switch, "True or False (or 1 or 0)"),
    "protocol": (lambda v: v is None or v in (2, 3, "2", "3"), "2, 3 or None"),
    # A cluster client's own.
    "cluster_error_retry_attempts": (lambda v: is_int(v) and v >= 0, "a non-negative int"),
    "reinitialize_steps": (lambda v: is_int(v) and v >= 0, "a non-negative int"),
    "require_full_coverage": (_is_switch, "True or False (or 1 or 0)"),
    "read_from_replicas": (_is_switch, "True or False (or 1 or 0)"),
}


def value_problems(parameters: Mapping[str, Any]) -> list[str]:
    """What is wrong with the values of known connection parameters, one text each naming
    the parameter, what it must be and the value given (see :data:`_VALUE_CHECKS`); an
    empty list: nothing. Reads nothing from a server."""
    problems = []
    for name in sorted(set(parameters) & set(_VALUE_CHECKS)):
        test, what = _VALUE_CHECKS[name]
        value = parameters[name]
        if not test(value):
            problems.append(f"{name} must be {what}, got {value!r} ({type(value).__name__})")
    return problems


def argument_problems(
    parameters: Mapping[str, Any], own: Collection[str], *, url: str | None, client: object, cluster: bool
) -> list[str]:
    """What is wrong with a broker's connection arguments, one text each (an empty list:
    nothing): each name of ``parameters`` that neither the broker (``own``) nor the redis-py
    client it makes takes, with the closest known name when one is close (a cluster
    client's parameter without ``cluster``: said so); a known parameter's value of the
    wrong type or range (:func:`value_problems`: ``socket_timeout="abc"`` would otherwise
    fail at the first send), unless a ``client`` is given; ``url`` with ``client`` (the
    client would be used, the url ignored); connection parameters with ``client`` (they
    would be ignored too). Reads nothing from a server."""
    known = connection_parameter_names(cluster)
    every = connection_parameter_names(True)
    problems = []
    for name in sorted(set(parameters) - known):
        close = difflib.get_close_matches(name, sorted(every | set(own)), n=1, cutoff=0.8)
        if name in every:
            problems.append(f"unknown argument {name}: a parameter of redis-py's cluster client, give cluster=True")
        elif close:
            problems.append(f"unknown argument {name}: did you mean {close[0]}?")
        else:
            problems.append(f"unknown argument {name}: neither RedissonBroker nor redis-py takes it")
    if client is None:  # with a client, they are refused below whatever their values
        problems += value_problems({name: value for name, value in parameters.items() if name in known})
    if client is not None and url is not None:
        problems.append(
            "url= and client= given together: the broker would use client= and ignore url=; pass only one of them"
        )
    elif client is not None and set(parameters) & known:
        names = ", ".join(sorted(set(parameters) & known))
        problems.append(
            f"connection parameters given with client= ({names}): the broker would ignore them; "
            "set them on the client you pass"
        )
    return problems


def connect(
    url: str | None,
    client: redis.Redis | RedisCluster | None,
    cluster: bool,
    namespace: str,
    parameters: dict[str, Any],
) -> tuple[redis.Redis | RedisCluster | None, dict[str, Any]]:
    """The broker's client and the connection parameters left for Dramatiq's RedisBroker
    (which makes a client from them when there is none): ``client`` as it is, or one made
    from ``url`` (a cluster's from ``url`` or the ``host``/``port`` parameters).

    Raises:
      TypeError: ``cluster=True`` with a client for one server.
      ValueError: On a cluster, a namespace with a hash tag; ``cluster=True`` against a
        server without cluster mode (see :func:`make_client`).
    """
    if client is not None and cluster and not isinstance(client, RedisCluster):
        raise TypeError(f"cluster=True needs a redis.cluster.RedisCluster client, got {type(client).__name__}")
    if cluster:
        check_cluster_name("namespace", namespace)
    if client is None and (url or cluster):
        return make_client(url, cluster, parameters), {}
    return client, parameters


def make_client(url: str | None, cluster: bool, parameters: dict[str, Any]) -> redis.Redis | RedisCluster:
    """A client for ``url`` (or the ``host``/``port`` parameters on a cluster).

    The built-in broker drops every connection parameter when a url is given; here they
    apply too (url query options still win), so ``url="rediss://…", ssl_ca_certs=…``
    verifies against that CA instead of failing."""
    if cluster:
        try:
            return RedisCluster.from_url(url, **parameters) if url else RedisCluster(**parameters)
        except RedisClusterException as e:
            node = _cluster_disabled_node(url, parameters)
            if node is None:
                raise
            where = "url" if url else "host/port"
            raise ValueError(
                f"{node} is not a cluster node (cluster_enabled:0): drop cluster=True, or point {where} at a "
                "cluster node"
            ) from e
    return redis.Redis.from_url(cast(str, url), **parameters)


def _cluster_disabled_node(url: str | None, parameters: Mapping[str, Any]) -> str | None:
    """The address (``host:port``) of the server a cluster client could not start on, when
    that server says it runs without cluster mode (``INFO cluster``: ``cluster_enabled:0``);
    ``None`` when it cannot be asked or is a cluster node (the client's own error then
    stands). One connection, reads only."""
    if not url and "host" not in parameters:
        return None  # the cluster client had no node to try
    accepted = _keyword_names(redis.Redis) - {"host", "port", "retry"}
    options = {name: value for name, value in parameters.items() if name in accepted}
    options["socket_timeout"] = options["socket_connect_timeout"] = 2
    try:
        if url:
            probe = redis.Redis.from_url(url, **options)
        else:
            probe = redis.Redis(host=parameters.get("host", "localhost"), port=parameters.get("port", 6379), **options)
    except Exception:
        return None
    try:
        enabled = probe.info("cluster").get("cluster_enabled")
        kwargs = probe.connection_pool.connection_kwargs
        address = kwargs.get("path") or f"{kwargs.get('host')}:{kwargs.get('port')}"
    except redis.RedisError:
        return None
    finally:
        close_client(probe)
    return str(address) if enabled in (0, "0") else None


def close_client(client: redis.Redis | RedisCluster) -> None:
    """Close the connections of a client the broker made."""
    if isinstance(client, RedisCluster):
        # RedisCluster.close() leaves its nodes' connection pools open (their sockets
        # close only when collected): disconnect them too.
        for node in client.get_nodes():
            if node.redis_connection is not None:
                node.redis_connection.connection_pool.disconnect()
        client.close()
    else:
        client.connection_pool.disconnect()


def client_retry_span_ms(client: redis.Redis | RedisCluster) -> int | None:
    """The longest time (ms) from a command's first run to the last automatic retry of it
    by ``client`` (redis-py retries a command on a connection error or timeout, and the
    first attempt may have run before its reply was lost), estimated from the client's
    ``Retry`` (retries, backoff cap) and socket timeouts; ``None`` when it retries
    forever or its settings cannot be read. A socket timeout of ``None`` counts as 0:
    such a client waits for a reply instead of retrying.

    A cluster client retries a command on top of its node connection's own retries:
    each of its attempts may take a node connection's whole span.
    """
    try:
        if isinstance(client, RedisCluster):
            node = client.get_redis_connection(client.get_default_node())
            per_node = client_retry_span_ms(node)
            retries = int(client.retry.get_retries())
            if per_node is None or retries < 0:
                return None
            return (retries + 1) * per_node + _backoff_total_ms(client.retry._backoff, retries)
        pool = client.connection_pool
        connection = pool.connection_class(**pool.connection_kwargs)  # not connected
        retry = connection.retry
        retries = int(retry.get_retries())
        socket_timeout = float(connection.socket_timeout or 0)
        connect_timeout = float(connection.socket_connect_timeout or 0)
        backoff = retry._backoff
    except Exception:
        return None
    if retries < 0:
        return None
    if retries == 0:
        return 0
    timeouts = 1000 * (socket_timeout + retries * (connect_timeout + socket_timeout))
    return math.ceil(timeouts) + _backoff_total_ms(backoff, retries)


def _backoff_total_ms(backoff: Any, retries: int) -> int:
    """The longest total pause (ms) of ``retries`` retries with ``backoff``."""
    cap = getattr(backoff, "_cap", None)
    base = getattr(backoff, "_base", None)
    total = 0.0
    for failures in range(1, retries + 1):
        if type(backoff).__name__ == "DecorrelatedJitterBackoff" and cap is not None:
            total += float(cap)
        elif cap is not None and base is not None:  # exponential ones, with or without jitter
            total += min(float(cap), float(base) * 2**failures)
        else:  # constant (or unknown): its value
            total += float(backoff.compute(failures))
    return math.ceil(1000 * total)


def server_address(client: Any) -> str:
    """Where ``client`` connects, for a log line: ``redis://host:port/db`` (``rediss://``
    with TLS), ``unix:///path``, ``the Sentinel service 'name'``, or the cluster's startup
    nodes. Never a password."""
    if isinstance(client, RedisCluster):
        nodes = ", ".join(sorted(node.name for node in client.get_nodes())) or "?"
        return f"the cluster at {nodes}"
    pool = getattr(client, "connection_pool", None)
    kwargs: dict[str, Any] = getattr(pool, "connection_kwargs", {}) or {}
    connection_class = getattr(pool, "connection_class", None)
    service = getattr(pool, "service_name", None)
    if service is not None:
        return f"the Sentinel service {service!r}"
    db = kwargs.get("db", 0)
    if connection_class is redis.UnixDomainSocketConnection:
        return f"unix://{kwargs.get('path', '?')}?db={db}"
    scheme = "rediss" if connection_class is redis.SSLConnection else "redis"
    return f"{scheme}://{kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}/{db}"


class Probe:
    """Whether the server of a client accepts TCP connections (a connect and a close: no
    command, no authentication, nothing for the server to do). ``None`` address: the
    client's server cannot be told (Sentinel, a cluster, a custom connection class) and
    :meth:`accepting` always says ``None``."""

    def __init__(self, client: Any, timeout: float = 0.05) -> None:
        self.timeout = timeout
        self.address: tuple[str, int] | str | None = None
        if isinstance(client, RedisCluster):
            return
        pool = getattr(client, "connection_pool", None)
        kwargs = getattr(pool, "connection_kwargs", {})
        connection_class = getattr(pool, "connection_class", None)
        if connection_class is redis.UnixDomainSocketConnection and kwargs.get("path"):
            self.address = str(kwargs["path"])
        elif connection_class in (redis.Connection, redis.SSLConnection) and kwargs.get("host"):
            self.address = (str(kwargs["host"]), int(kwargs.get("port") or 6379))

    def accepting(self) -> bool | None:
        if self.address is None:
            return None
        family = socket.AF_UNIX if isinstance(self.address, str) else socket.AF_INET
        try:
            if family == socket.AF_INET:
                with socket.create_connection(cast("tuple[str, int]", self.address), timeout=self.timeout):
                    return True
            with socket.socket(family, socket.SOCK_STREAM) as sock:
                sock.settimeout(self.timeout)
                sock.connect(self.address)
                return True
        except OSError:
            return False
