"""What differs between one server and a Redis Cluster, in one place.

A broker holds one :class:`Topology`, chosen by its client, and every part asks it
instead of testing for a cluster itself:

- **Key placement** (:meth:`Topology.keys`, made once per queue): the plain layout, or
  every key of a queue under the queue's hash tag (names checked for ``{``/``}``); see
  ``dramatiq_redisson._keys``. Whether a queue's shards spread over several servers
  (:attr:`Topology.spreads_shards`).
- **Which connection runs a command on a key** (:meth:`Topology.node`,
  :meth:`Topology.by_node`), and what a failed or redirected call sent that way means
  (:meth:`Topology.follow`: on a cluster, reload the slot map and send again).
- **Pub/sub**: SUBSCRIBE on the server, or sharded SSUBSCRIBE on the node of the
  channel's slot (:meth:`Topology.pubsub`, :meth:`Topology.subscribe`,
  :meth:`Topology.unsubscribe`, :meth:`Topology.numsub`).
- **Reads over many queues** (:meth:`Topology.each`): one pipeline, one round trip, on
  one server; on a cluster one call per queue, each on the node of its slot.
- **The client's lifecycle**: how long it retries a command, closing what the broker
  opened.

:class:`OneServer` is a single server, plain or found through Sentinel (what Sentinel
adds is the primary's address, which redis-py's pool and :mod:`dramatiq_redisson.connection._primary_watch`
follow). :class:`Cluster` is a Redis/Valkey Cluster. A queue spread over several slots
would be a third implementation of the same interface.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, cast

import redis
from redis.cluster import RedisCluster
from redis.exceptions import MovedError

from .._keys import QueueKeys, check_cluster_name
from ._client import client_retry_span_ms, close_client

#: How long a call redirected by a cluster (a migration or failover under way) pauses
#: before the slot map is reloaded (a MOVED reply: not at all, the map is simply stale).
REDIRECT_PAUSE = 0.1

#: The hash slots of a cluster (one server: as many, all its own).
SLOT_COUNT = 16384

#: How many queues' :class:`QueueKeys` :meth:`Topology.keys` keeps (made once per queue,
#: not per message; past this many names it starts over).
KEYS_KEPT = 4096

#: One call of :meth:`Topology.each`: given a client (a pipeline on one server, ``None``
#: on a cluster: the cluster client routes it), it sends its command.
Call = Callable[[Any], Any]


class Topology:
    """The interface; see the module. ``client`` is the broker's client."""

    #: The cluster key layout (every key of a queue under its hash tag) and sharded
    #: pub/sub; also what the ACL rule is rendered for.
    cluster: ClassVar[bool] = False
    #: Dramatiq's built-in dispatch script (``do_qsize``, ``do_purge``…) can run: its
    #: keys span slots.
    runs_dispatch_script: ClassVar[bool] = True
    #: The command that counts a channel's subscribers (written whole: the ACL test reads it).
    numsub_command: ClassVar[tuple[str, str]] = ("PUBSUB", "NUMSUB")
    #: A queue's shards can land on different servers (a cluster's masters), which is
    #: what sharding gains; on one server they all share it. So can a queue and the
    #: namespace's workflows: a queue's estimate of its server's clock is the workflows'
    #: only when this is False.
    spreads_shards: ClassVar[bool] = False

    def __init__(self, client: Any) -> None:
        self.client = client
        self._keys: dict[tuple[str, str], QueueKeys] = {}

    def script_source(self, source: bytes) -> bytes:
        """A script's text as it runs here."""
        return source

    def check_name(self, kind: str, name: str) -> None:
        """Refuse a namespace or queue name this topology cannot place (``ValueError``)."""

    def keys(self, namespace: str, queue_name: str) -> QueueKeys:
        """The key names of a queue (see ``dramatiq_redisson._keys``), made once per queue.

        Raises:
          ValueError: A queue name this topology cannot place.
        """
        keys = self._keys.get((namespace, queue_name))
        if keys is None:
            self.check_name("queue name", queue_name)
            if len(self._keys) >= KEYS_KEPT:
                self._keys.clear()
            keys = self._keys[namespace, queue_name] = QueueKeys(namespace, queue_name, self.cluster)
        return keys

    def node(self, key: str) -> redis.Redis:
        """A client whose connections reach the server that holds ``key``."""
        return cast("redis.Redis", self.client)

    def node_name(self, key: str) -> str:
        """A name of the server that holds ``key`` (the same for every key it holds now)."""
        return ""

    def by_node(self, first_keys: Sequence[str]) -> list[tuple[redis.Redis, list[int]]]:
        """Calls grouped by the server they run on: ``(client, indexes)`` pairs, where
        call ``i`` touches ``first_keys[i]`` (and keys of its slot)."""
        return [(self.node(first_keys[0]), list(range(len(first_keys))))] if first_keys else []

    def follow(self, error: Exception | None) -> bool:
        """A call sent to :meth:`node` failed with ``error`` (a redirect, a lost
        connection): get ready for the next one. Returns whether sending it again may
        reach the right server (a redirect)."""
        return False

    def pubsub(self, key: str) -> redis.client.PubSub:
        """A pub/sub connection for channels of ``key``'s slot."""
        # (Typed by assignment, not cast: redis-py 8.2 types pubsub(), earlier releases do not.)
        connection: redis.client.PubSub = self.node(key).pubsub()
        return connection

    def subscribe(self, pubsub: Any, *channels: str) -> None:
        pubsub.subscribe(*channels)

    def unsubscribe(self, pubsub: Any, *channels: str) -> None:
        pubsub.unsubscribe(*channels)

    def numsub(self, key: str, channels: Sequence[str]) -> dict[str, int]:
        """Channel -> subscribers, as the server of ``key`` counts them."""
        if not channels:
            return {}
        return numsub_counts(self.node(key).execute_command(*self.numsub_command, *channels))

    def numsub_in(self, pipe: Any, channels: Sequence[str]) -> None:
        """Queue the count of ``channels``' subscribers in ``pipe`` (a pipeline of
        :meth:`node`'s client; read its reply with :func:`numsub_counts`)."""
        pipe.execute_command(*self.numsub_command, *channels)

    def each(self, calls: Sequence[Call]) -> list[Any]:
        """Run ``calls`` (reads of one queue each) and return their replies in order:
        on one server in one pipeline (one round trip)."""
        with self.client.pipeline(transaction=False) as pipe:
            for call in calls:
                call(pipe)
            return cast("list[Any]", pipe.execute())

    def address(self) -> str:
        """Where the client connects, without credentials: ``host:port/db``, ``unix:path``,
        or on a cluster ``cluster:host:port`` of the node it started from."""
        kwargs = self.client.connection_pool.connection_kwargs
        if "path" in kwargs:
            return f"unix:{kwargs['path']}"
        return f"{kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}/{kwargs.get('db', 0)}"

    def retry_span_ms(self) -> int | None:
        """How long the client may retry one command (see :func:`._client.client_retry_span_ms`)."""
        return client_retry_span_ms(self.client)

    def close(self) -> None:
        """Close the client's connections (only for a client the broker made)."""
        close_client(self.client)

    def slot_ranges(self) -> list[tuple[int, int, str]]:
        """Who serves each hash slot now, as ``(first slot, last slot, node name)``
        ranges (CLUSTER SLOTS' shape, from the client's slot map: no round trip): on one
        server, every slot is its own."""
        return [(0, SLOT_COUNT - 1, "server")]


class OneServer(Topology):
    """A single server, plain or behind Sentinel: every key on one connection pool."""


class Cluster(Topology):
    """A Redis/Valkey Cluster (``client``: a :class:`redis.cluster.RedisCluster`)."""

    cluster = True
    runs_dispatch_script = False
    spreads_shards = True
    numsub_command = ("PUBSUB", "SHARDNUMSUB")

    def script_source(self, source: bytes) -> bytes:
        """Announcements go out with SPUBLISH (sharded pub/sub): a queue's channels live
        on the node that owns its slot."""
        return source.replace(b'"PUBLISH"', b'"SPUBLISH"')

    def check_name(self, kind: str, name: str) -> None:
        check_cluster_name(kind, name)

    def node(self, key: str) -> redis.Redis:
        """A client of the primary that owns ``key``'s slot (per the slot map)."""
        client = self.client
        return cast("redis.Redis", client.get_redis_connection(client.get_node_from_key(key)))

    def node_name(self, key: str) -> str:
        return str(self.client.get_node_from_key(key).name)

    def by_node(self, first_keys: Sequence[str]) -> list[tuple[redis.Redis, list[int]]]:
        indexes: dict[str, list[int]] = defaultdict(list)
        clients: dict[str, redis.Redis] = {}
        for i, key in enumerate(first_keys):
            node = self.client.get_node_from_key(key)
            indexes[node.name].append(i)
            clients[node.name] = self.client.get_redis_connection(node)
        return [(clients[name], found) for name, found in indexes.items()]

    def follow(self, error: Exception | None) -> bool:
        """Pause briefly (a migration or failover is under way; a MOVED reply: not at
        all, the map is only stale), then reload the slot map."""
        time.sleep(REDIRECT_PAUSE if not isinstance(error, MovedError) else 0)
        try:
            self.client.nodes_manager.initialize()
        except (redis.RedisError, OSError):
            pass  # the next call fails the same way and tries again
        return True

    def address(self) -> str:
        node = self.client.get_default_node()
        return f"cluster:{node.host}:{node.port}"

    def subscribe(self, pubsub: Any, *channels: str) -> None:
        pubsub.ssubscribe(*channels)

    def unsubscribe(self, pubsub: Any, *channels: str) -> None:
        pubsub.sunsubscribe(*channels)

    def each(self, calls: Sequence[Call]) -> list[Any]:
        """One call after another, each routed by the cluster client to its slot's node."""
        return [call(None) for call in calls]

    def slot_ranges(self) -> list[tuple[int, int, str]]:
        """Each primary's runs of slots, by the slot map the client holds (a slot that
        no node serves is in no range)."""
        slots = self.client.nodes_manager.slots_cache
        ranges: list[tuple[int, int, str]] = []
        for slot in range(SLOT_COUNT):
            nodes = slots.get(slot)
            if not nodes:
                continue
            name = str(nodes[0].name)
            if ranges and ranges[-1][2] == name and ranges[-1][1] == slot - 1:
                ranges[-1] = (ranges[-1][0], slot, name)
            else:
                ranges.append((slot, slot, name))
        return ranges


def topology_for(client: Any) -> Topology:
    """The topology of ``client``: :class:`Cluster` for a ``RedisCluster``, else
    :class:`OneServer`."""
    return Cluster(client) if isinstance(client, RedisCluster) else OneServer(client)


def numsub_counts(reply: Any) -> dict[str, int]:
    """A NUMSUB/SHARDNUMSUB reply (flat, or pairs under RESP3) as a dict."""
    flat = not reply or not isinstance(reply[0], (list, tuple))
    pairs = list(zip(reply[::2], reply[1::2], strict=True)) if flat else reply
    return {(c.decode() if isinstance(c, bytes) else str(c)): int(n) for c, n in pairs}
