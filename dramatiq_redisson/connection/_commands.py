"""The raw Redis commands the package sends outside its Lua scripts, as typed Protocols.

Parts that hold the broker's client (or a pipeline of it) declare it as
:class:`Commands` (or :class:`PipelineCommands`) rather than ``Any``: both a
:class:`redis.Redis` and a :class:`redis.cluster.RedisCluster` satisfy them, so the same
code runs on one server and on a cluster, and a command nobody listed here is a type
error. The signatures are redis-py's, narrowed to the arguments the package passes
(extra options keyword-only, so both clients' positional orders fit). Replies are
``Any``: a pipeline's commands return the pipeline while they queue, and a reply's type
depends on the client's ``decode_responses``.

Who sends what (besides the scripts, run by ``scripts._runner`` with
``register_script``/``script_load``/``evalsha``/``eval``, in a pipeline with ``wait``):

- sorted sets: ``zrange``/``zcard``/``zscore``/``zrangebyscore``/``zrem`` (dead letters,
  the delayed-queue view, paging, queue admin, running messages, liveness, leftovers,
  schedules, sharded views);
- hashes: ``hget``/``hgetall``/``hmget``/``hset``/``hdel``/``hexists`` (queue limits,
  liveness, schedules, dead letters, leftovers, running messages, the delayed queue);
- sets: ``sadd``/``srem``/``smembers`` (the queue registry, acks of a worker);
- lists: ``lrange``/``llen`` (queue admin, leftovers);
- keys: ``unlink`` and ``scan_iter`` (queue admin's flush, leftovers);
- server: ``time`` (admin, schedules, the CLI), ``info`` (the producer's memory check,
  the client's cluster probe, the embedded server), ``ping`` (the embedded server),
  ``execute_command`` (``HELLO``, ``PUBSUB NUMSUB``/``SHARDNUMSUB``, the ACL probes);
- ``pipeline(transaction=False)`` (one round trip for many reads), ``pubsub()``
  (announcements; see :class:`Subscription`) and ``close()``.

What differs between one server and a cluster (which node a key lives on, sharded
pub/sub, the slot map) is not here: ask the broker's ``connection._topology.Topology``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from types import TracebackType
from typing import Any, Protocol

#: A key, field, member or value as redis-py encodes it.
Value = str | bytes | int | float


class _Reads(Protocol):
    """The commands a client and its pipelines both send (see the module)."""

    # -- sorted sets
    def zrange(self, name: str, start: int, end: int, *, desc: bool = ..., withscores: bool = ...) -> Any: ...
    def zrangebyscore(
        self,
        name: str,
        min: float | str,
        max: float | str,
        start: int | None = ...,
        num: int | None = ...,
        *,
        withscores: bool = ...,
    ) -> Any: ...
    def zcard(self, name: str) -> Any: ...
    def zscore(self, name: str, value: Value) -> Any: ...
    def zrem(self, name: str, *values: Value) -> Any: ...

    # -- hashes
    def hget(self, name: str, key: Value) -> Any: ...
    def hgetall(self, name: str) -> Any: ...
    def hmget(self, name: str, keys: Iterable[Value], *args: Value) -> Any: ...
    def hset(
        self,
        name: str,
        key: Value | None = ...,
        value: Value | None = ...,
        mapping: Mapping[Any, Any] | None = ...,
    ) -> Any: ...
    def hdel(self, name: str, *keys: Value) -> Any: ...
    def hexists(self, name: str, key: Value) -> Any: ...

    # -- sets
    def sadd(self, name: str, *values: Value) -> Any: ...
    def srem(self, name: str, *values: Value) -> Any: ...
    def smembers(self, name: str) -> Any: ...

    # -- lists and keys
    def lrange(self, name: str, start: int, end: int) -> Any: ...
    def llen(self, name: str) -> Any: ...
    def unlink(self, *names: str) -> Any: ...

    # -- server and scripts
    def time(self) -> Any: ...
    def wait(self, num_replicas: int, timeout: int) -> Any: ...
    def evalsha(self, sha: str, numkeys: int, *keys_and_args: Value) -> Any: ...
    def execute_command(self, *args: Any, **options: Any) -> Any: ...


class PipelineCommands(_Reads, Protocol):
    """A pipeline of :class:`Commands` (``client.pipeline(transaction=False)``): its
    commands queue (each returns the pipeline) and :meth:`execute` sends them in one
    round trip, returning their replies in order. A cluster's pipeline cannot send
    ``EVAL``: a script pipelined by source runs on a pipeline of one node's
    :class:`redis.Redis` (``Topology.node``), a :class:`redis.client.Pipeline`."""

    def execute(self, raise_on_error: bool = ...) -> list[Any]: ...
    def __enter__(self) -> Any: ...
    def __exit__(
        self, exc_type: type[BaseException] | None, exc_value: BaseException | None, traceback: TracebackType | None
    ) -> Any: ...


class Subscription(Protocol):
    """A pub/sub connection (``client.pubsub()``): plain channels (SUBSCRIBE) and
    sharded ones (SSUBSCRIBE, on a cluster); ``Topology.subscribe`` picks which."""

    def subscribe(self, *channels: str) -> Any: ...
    def unsubscribe(self, *channels: str) -> Any: ...
    def ssubscribe(self, *channels: str) -> Any: ...
    def sunsubscribe(self, *channels: str) -> Any: ...
    def get_message(self, ignore_subscribe_messages: bool = ..., timeout: float = ...) -> Any: ...
    def close(self) -> Any: ...


class Commands(_Reads, Protocol):
    """A client of the broker's server or cluster: :class:`redis.Redis` or
    :class:`redis.cluster.RedisCluster` (see the module for who sends what)."""

    def pipeline(self, transaction: Any = ..., shard_hint: Any = ...) -> PipelineCommands: ...
    def pubsub(self) -> Subscription: ...
    def eval(self, script: str, numkeys: int, *keys_and_args: Value) -> Any: ...
    def scan_iter(self, match: str | None = ..., count: int | None = ...) -> Iterator[Any]: ...
    def info(self, section: str | None = ...) -> Any: ...
    def ping(self) -> Any: ...
    def script_load(self, script: str | bytes) -> Any: ...
    def register_script(self, script: str | bytes) -> Any: ...
    def close(self) -> None: ...
