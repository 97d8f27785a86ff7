"""Least privilege: the ACL rule a deployment should give the broker's Redis user, and a
probe that tells, in one error, everything such a user is missing.

The rule is derived from every command the broker issues:

* :data:`SCRIPT_COMMANDS`: inside the Lua scripts (``lua/*.lua``);
* :data:`CLIENT_COMMANDS`: from Python (broker, consumer, delayed queue);
* :data:`SCRIPTING_COMMANDS`: how scripts run (:class:`redis.commands.core.Script`
  sends EVALSHA and, on NOSCRIPT, SCRIPT LOAD; a pipeline first asks SCRIPT EXISTS and
  loads what is missing; the producer's streamed calls fall back to EVAL);
* :data:`PUBSUB_COMMANDS`: the consumer's subscription (SUBSCRIBE; UNSUBSCRIBE and the
  health-check PING of redis-py's PubSub);
* :data:`CONNECTION_COMMANDS`: redis-py's connection setup (SELECT for a database other
  than 0; CLIENT SETINFO, whose refusal redis-py ignores but the server writes to its
  ACL log on every new connection);
* :data:`REPLICATION_COMMANDS`: WAIT, sent only by a broker with ``wait_for_replicas``,
  so in the rule only when asked for (``acl_rule(wait_for_replicas=True)``).

On Redis Cluster (``acl_rule(cluster=True)``, :data:`CLUSTER_COMMANDS`) the broker uses
sharded pub/sub (:data:`SHARDED_PUBSUB`: SPUBLISH in the scripts, SSUBSCRIBE and
SUNSUBSCRIBE in the consumer) instead of PUBLISH/SUBSCRIBE/UNSUBSCRIBE, never sends
:data:`NOT_ON_CLUSTER`, and redis-py's cluster client adds
:data:`CLUSTER_CLIENT_COMMANDS`; the cluster key layout (see :mod:`._keys`) adds the key
pattern ``{ns:*``.

``tests/connection/test_acl.py`` parses the Lua scripts and the Python sources and fails when they
use a command missing here (or from :data:`OPTIONAL_COMMANDS`, which the rule leaves out).
:func:`acl_rule` renders the rule; ``docs/security.md`` carries its output (checked by
the same tests).

:func:`check_permissions` runs ``lua/probe.lua`` and tries the Python-side commands in
harmless forms, and raises :class:`MissingPermission` naming every missing command, key
and channel at once. On a cluster it runs on the node that owns the queue's slot, with
the queue's slot-local keys only; the namespace's queue registry (another slot) is
checked through the cluster client.
"""

from __future__ import annotations

import hashlib
import re
import time
from importlib import resources
from typing import Any, NoReturn, cast

import redis
from redis.cluster import RedisCluster
from redis.crc import key_slot
from redis.exceptions import NoPermissionError

from .._errors import MissingPermission
from .._keys import QueueKeys, acks_pattern, channels_pattern, lane_id
from ._server import server_versions

#: Commands the Lua scripts in ``lua/`` issue (``redis.call``/``redis.pcall``).
SCRIPT_COMMANDS: tuple[str, ...] = (
    "bitfield",
    "del",
    "exists",
    "get",
    "hdel",
    "hexists",
    "hget",
    "hgetall",
    "hincrby",
    "hkeys",
    "hlen",
    "hmget",
    "hset",
    "hsetnx",
    "lindex",
    "llen",
    "lpop",
    "lpush",
    "lrange",
    "lrem",
    "ltrim",
    "mget",
    "pexpire",
    "publish",
    "rename",
    "rpush",
    "sadd",
    "set",
    "smembers",
    "srem",
    "time",  # in @fast, not @read: a rule built from categories like "+@read +@write" lacks it
    "unlink",
    "zadd",
    "zcard",
    "zcount",
    "zmscore",
    "zpopmax",
    "zrange",
    "zrangebyscore",
    "zrank",
    "zrem",
    "zremrangebyscore",
    "zscore",
)

#: Commands issued from Python: ``RedissonBroker`` (flush's SREM and UNLINK; stats' TIME,
#: ZRANGEBYSCORE of heartbeats and SMEMBERS of the queue registry; the first send to a queue, SADD
#: to that registry), its consumer (SMEMBERS, LRANGE, HMGET, ZRANGEBYSCORE, SCAN, ZREM),
#: ``DelayedQueue`` (ZCARD, HEXISTS, ZRANGE, HMGET) and ``DeadLetters`` (ZCARD, ZRANGE,
#: HMGET, ZSCORE, HGET). No MULTI/EXEC: on a full server Redis before 7.4 and Valkey 7.2
#: refuse every command queued in a transaction, reads included.
CLIENT_COMMANDS: tuple[str, ...] = (
    "hdel",
    "hexists",
    "hget",
    "hgetall",
    "hmget",
    "hset",
    "llen",
    "lrange",
    "sadd",
    "scan",
    "smembers",
    "srem",
    "time",
    "unlink",
    "zcard",
    "zrange",
    "zrangebyscore",
    "zrem",
    "zscore",
)

#: How the scripts run: EVALSHA (redis-py's ``Script``; SCRIPT LOAD on NOSCRIPT, SCRIPT
#: EXISTS first in a pipeline) and, for the producer's scripts, EVAL with the source when
#: EVALSHA misses (``Scripts.stream``).
SCRIPTING_COMMANDS: tuple[str, ...] = ("eval", "evalsha", "script|exists", "script|load")

#: The consumer's subscription to its queue's channel.
PUBSUB_COMMANDS: tuple[str, ...] = ("ping", "pubsub|numsub", "subscribe", "unsubscribe")

#: redis-py's connection setup (on Redis >= 7.2 and Valkey: see :func:`connection_commands`).
CONNECTION_COMMANDS: tuple[str, ...] = ("client|setinfo", "select")


def connection_commands(server_version: tuple[int, int, int] | None = None) -> tuple[str, ...]:
    """:data:`CONNECTION_COMMANDS` as the server at ``server_version`` takes them (None:
    Redis >= 7.2 and every Valkey, which number from 7.2).

    redis-py sends CLIENT SETINFO on every new connection (and redis-py 8, on RESP3, CLIENT
    MAINT_NOTIFICATIONS), ignoring a refusal. How servers treat that differs:

    * 7.2 and later know CLIENT SETINFO: the rule grants it, else each connection writes a
      denial to the ACL log. They refuse the unknown MAINT_NOTIFICATIONS before the ACL
      check, which logs nothing.
    * 7.0 and 7.1 know neither, and ACL SETUSER refuses ``+client|setinfo`` ("Unknown
      command or category name in ACL"); they refuse the unknown subcommands before the
      ACL check too. So the rule leaves it out and nothing is logged.
    * 6.2 checks a subcommand rule against the first argument only (it accepts any name)
      and checks the ACL before the subcommand: the rule names both subcommands so that
      the server answers "Unknown subcommand" instead of logging a denial. They grant
      nothing, as 6.2 has neither.
    """
    if server_version is None or server_version >= (7, 2, 0):
        return CONNECTION_COMMANDS
    if server_version >= (7, 0, 0):
        return ("select",)
    return ("client|maint_notifications", "client|setinfo", "select")


#: Sent only by a broker with ``wait_for_replicas`` (after each write it covers), so
#: granted only by ``acl_rule(wait_for_replicas=True)``.
REPLICATION_COMMANDS: tuple[str, ...] = ("wait",)

#: Commands the broker may issue but does without when refused, left out of the rule:
#: INFO (``@dangerous``) only words the message of ``ServerMemoryFull``.
OPTIONAL_COMMANDS: tuple[str, ...] = ("info",)

#: Commands the server runs for any user, outside the ACL (it exempts HELLO and AUTH):
#: HELLO tells the broker's start-up check the server's version (see :mod:`dramatiq_redisson.connection._server`).
UNGUARDED_COMMANDS: tuple[str, ...] = ("hello",)

#: Every command the broker's Redis user needs, sorted.
COMMANDS: tuple[str, ...] = tuple(
    sorted(
        set(SCRIPT_COMMANDS)
        | set(CLIENT_COMMANDS)
        | set(SCRIPTING_COMMANDS)
        | set(PUBSUB_COMMANDS)
        | set(CONNECTION_COMMANDS)
    )
)

#: On Redis Cluster, pub/sub is sharded (a queue's channels live on the node of its
#: slot): the scripts publish with SPUBLISH (their source is rewritten when loaded), the
#: consumer subscribes with SSUBSCRIBE and unsubscribes with SUNSUBSCRIBE.
SHARDED_PUBSUB: dict[str, str] = {
    "publish": "spublish",
    "subscribe": "ssubscribe",
    "unsubscribe": "sunsubscribe",
    "pubsub|numsub": "pubsub|shardnumsub",
}

#: Commands of :data:`COMMANDS` a cluster broker never sends: SCAN (the maintenance of
#: dead workers' ack sets is per queue there, without SCAN), SELECT (a cluster has only
#: database 0), SCRIPT EXISTS (only a pipeline that runs scripts sends it: ``stats`` on a
#: single server; on a cluster each queue's call goes alone to its node).
NOT_ON_CLUSTER: tuple[str, ...] = ("scan", "script|exists", "select")

#: What redis-py's :class:`redis.cluster.RedisCluster` itself sends: CLUSTER SLOTS (the
#: slot map, at start and on every refresh after a redirect or a failover), COMMAND (its
#: command table, at start, to find the keys of a command) and ASKING (before a command
#: it follows an ASK redirect with, while a slot migrates).
CLUSTER_CLIENT_COMMANDS: tuple[str, ...] = ("asking", "cluster|slots", "command")

#: Every command the broker's Redis user needs on Redis Cluster, sorted.
CLUSTER_COMMANDS: tuple[str, ...] = tuple(
    sorted(
        (set(COMMANDS) - set(SHARDED_PUBSUB) - set(NOT_ON_CLUSTER))
        | set(SHARDED_PUBSUB.values())
        | set(CLUSTER_CLIENT_COMMANDS)
    )
)

#: The commands the Lua scripts issue on a cluster (PUBLISH becomes SPUBLISH).
CLUSTER_SCRIPT_COMMANDS: tuple[str, ...] = tuple(sorted(SHARDED_PUBSUB.get(c, c) for c in SCRIPT_COMMANDS))


def rule_commands(
    *, wait_for_replicas: bool = False, cluster: bool = False, server_version: tuple[int, int, int] | None = None
) -> tuple[str, ...]:
    """The commands :func:`acl_rule` grants, sorted."""
    commands = set(CLUSTER_COMMANDS if cluster else COMMANDS) - set(CONNECTION_COMMANDS)
    commands |= set(connection_commands(server_version))
    if cluster:
        commands -= set(NOT_ON_CLUSTER)
    if wait_for_replicas:
        commands |= set(REPLICATION_COMMANDS)
    return tuple(sorted(commands))


def _script_commands(cluster: bool) -> tuple[str, ...]:
    return CLUSTER_SCRIPT_COMMANDS if cluster else SCRIPT_COMMANDS


#: Where the rule is explained.
DOCS = "'Least privilege' in docs/security.md of dramatiq-redisson"

_GLOB_SPECIAL = re.compile(r"([\\*?\[\]])")


def _glob_escape(text: str) -> str:
    return _GLOB_SPECIAL.sub(r"\\\1", text)


def key_patterns(namespace: str = "dramatiq", *, cluster: bool = False) -> tuple[str, ...]:
    """The key patterns of a namespace: its Dramatiq keys (``ns:*``: queues, messages,
    acks, heartbeats, dead letters, legacy ``.DQ``) and its Redisson structures
    (``redisson_delay_queue*:{ns:*}``; the channel name is one of the script KEYS too).

    ``cluster``: the cluster layout's too, whose queue keys begin with the queue's hash
    tag (``{ns:*``: ``{ns:Q}``, ``{ns:Q}.msgs``, ``{ns:Q}.XQ``, ...); acks, heartbeats and
    the registry stay under ``ns:*``."""
    ns = _glob_escape(namespace)
    if cluster:
        return (f"{ns}:*", f"{{{ns}:*", f"redisson_delay_queue*:{{{ns}:*}}")
    return (f"{ns}:*", f"redisson_delay_queue*:{{{ns}:*}}")


def channel_patterns(namespace: str = "dramatiq") -> tuple[str, ...]:
    """The pub/sub channel pattern of a namespace's queues."""
    return (channels_pattern(_glob_escape(namespace)),)


def acl_tokens(
    namespace: str = "dramatiq",
    *,
    wait_for_replicas: bool = False,
    cluster: bool = False,
    server_version: tuple[int, int, int] | None = None,
) -> list[str]:
    """The ACL SETUSER arguments of :func:`acl_rule`, one list item per argument."""
    granted = rule_commands(wait_for_replicas=wait_for_replicas, cluster=cluster, server_version=server_version)
    return [
        "resetkeys",
        "resetchannels",
        "-@all",
        *(f"+{command}" for command in granted),
        *(f"~{pattern}" for pattern in key_patterns(namespace, cluster=cluster)),
        *(f"&{pattern}" for pattern in channel_patterns(namespace)),
    ]


def acl_rule(
    namespace: str = "dramatiq",
    *,
    wait_for_replicas: bool = False,
    cluster: bool = False,
    server_version: tuple[int, int, int] | None = None,
) -> str:
    """The ACL rule of the broker's Redis user for ``namespace``, as ACL SETUSER text
    without user name, ``on`` and password::

        ACL SETUSER worker on >secret <acl_rule()>

    The rule follows the server's version (``server_version``, ``(major, minor, patch)``;
    None: Redis >= 7.2 and every Valkey): see :func:`connection_commands` for what differs.
    :meth:`RedissonBroker.acl_rule <dramatiq_redisson.RedissonBroker.acl_rule>` renders it
    for the server the broker is connected to, and ``dramatiq-redisson acl-rule`` prints it.

    It grants exactly :data:`COMMANDS` on the namespace's keys and channels and nothing
    else (``resetkeys resetchannels -@all`` first, so applying it to an existing user
    also takes away what it had). Glob characters in ``namespace`` are escaped.
    ``wait_for_replicas=True`` adds ``+wait``, which a broker with ``wait_for_replicas``
    needs. ``cluster=True``: the rule of a broker on Redis Cluster (:data:`CLUSTER_COMMANDS`
    and the cluster layout's key pattern ``{ns:*``), to be applied on every node.

    Raises:
      ValueError: If ``namespace`` contains whitespace (it could not be written as
        space-separated ACL text; pass :func:`acl_tokens` as separate arguments).
    """
    if any(c.isspace() for c in namespace):
        raise ValueError(f"namespace {namespace!r} contains whitespace; use acl_tokens()")
    return " ".join(
        acl_tokens(namespace, wait_for_replicas=wait_for_replicas, cluster=cluster, server_version=server_version)
    )


def is_permission_error(error: BaseException) -> bool:
    """Whether ``error`` is an ACL refusal: a NOPERM reply (:class:`NoPermissionError`)
    or a refusal inside a script, which reaches redis-py as a plain ``ResponseError``
    starting ``ACL failure in script:``."""
    if isinstance(error, NoPermissionError):
        return True
    text = str(error)
    return isinstance(error, redis.ResponseError) and (
        "ACL failure in script" in text or "The user executing the script can't" in text  # Redis 7+/Valkey, 6.2
    )


_PROBE_SOURCE = resources.files("dramatiq_redisson.scripts").joinpath("lua", "probe.lua").read_bytes()
_PROBE_SHA = hashlib.sha1(_PROBE_SOURCE).hexdigest()
#: The probe on a cluster: it checks SPUBLISH instead of PUBLISH, as the broker's scripts
#: are rewritten (``_scripts._CLUSTER_SOURCES``).
_CLUSTER_PROBE_SOURCE = _PROBE_SOURCE.replace(b'"PUBLISH"', b'"SPUBLISH"')
_CLUSTER_PROBE_SHA = hashlib.sha1(_CLUSTER_PROBE_SOURCE).hexdigest()

#: The field / member name the probe reads and "removes" on real keys (no entry has it).
PROBE_TOKEN = "__dramatiq_redisson_permission_probe__"

#: Longest wait (s) for the reply to the probe's SUBSCRIBE.
SUBSCRIBE_TIMEOUT = 5.0

_DENIED_COMMAND = re.compile(r"no permissions to run the '([^']+)' command", re.IGNORECASE)

#: Commands whose refusal on a "key" (Redis 6.2's wording inside scripts) is one on a channel.
_CHANNEL_COMMANDS = frozenset({"publish", "subscribe", "spublish", "ssubscribe"})

#: Commands in the probe that only read their key (for "(read)" / "(write)" notes).
_READS = frozenset(
    "exists get hexists hget hlen hmget lindex llen lrange mget smembers zcard zmscore zrange zrangebyscore"
    " zscore".split()
)


def scratch_key(keys: QueueKeys) -> str:
    """A key of the queue's namespace that the broker never uses; the probe creates and
    removes things there (``ns:Q.__permission_probe__``; on a cluster in the queue's
    slot, ``{ns:Q}.__permission_probe__``)."""
    return f"{keys.ready}.__permission_probe__"


#: The lane the probe checks for all of a queue's lanes (they share the key pattern).
PROBED_LANE = lane_id(1, "probe")


def _typed_keys(keys: QueueKeys, worker_id: str) -> list[str]:
    pairs = (
        ("list", keys.ready),
        ("hash", keys.ready_msgs),
        ("set", keys.acks(worker_id)),
        ("zset", keys.heartbeats),
        ("set", keys.registry),
        ("zset", keys.xq),
        ("hash", keys.xq_msgs),
        ("list", keys.legacy_dq),
        ("hash", keys.legacy_dq_msgs),
        ("set", keys.legacy_dq_acks(worker_id)),
        ("zset", keys.timeout_zset),
        ("list", keys.backup_list),
        ("hash", keys.payloads),
        ("list", keys.compact_list),
        ("string", keys.compact_cursor),
        ("zset", keys.sent),
        ("hash", keys.dedupe),
        ("hash", keys.keyed),
        ("zset", keys.holds),
        ("hash", keys.held),
        ("hash", keys.schedules),
        ("hash", keys.chains),
        ("hash", keys.schedule_state),
        ("string", keys.paused),
        ("hash", keys.fetched),
        ("string", keys.minutes),
        ("string", keys.hours),
        ("string", keys.lease),
        ("zset", keys.consumers),
        ("zset", keys.idle),
        ("zset", keys.alive),
        ("hash", keys.subscribers),
        ("hash", keys.flow),
        ("string", keys.flow_flag),
        ("zset", keys.levels),
        ("hash", keys.lane_of),
        ("list", keys.lane(PROBED_LANE)),  # one lane, ring and rate log stand for all
        ("list", keys.ring(1)),
        ("list", keys.rate_log()),
        ("zset", keys.deferred),
        ("hash", keys.shards),
        ("none", keys.channel),  # also a script KEY (offer, enqueue): checked as a key
        ("none", keys.wake_channel(worker_id)),  # matches the key and channel patterns
    )
    # On a cluster the registry is in another slot than the queue's keys: it is checked
    # through the cluster client (see _routed_calls), not inside the probe.
    return [item for pair in pairs if not (keys.cluster and pair[1] == keys.registry) for item in pair]


def _client_calls(
    keys: QueueKeys, worker_id: str, wait_for_replicas: bool = False
) -> list[tuple[str, str, tuple[Any, ...]]]:
    """``(command, target, arguments)``: every call the broker makes from Python, in a
    harmless form, then the probe script. ``wait_for_replicas``: WAIT too (``WAIT 0 0`` returns at once).

    On a cluster (``keys.cluster``) the calls all go to the node of the queue's slot: no
    SCAN, SELECT or SCRIPT EXISTS (a cluster broker sends none), the cluster client's
    own ASKING, CLUSTER SLOTS and COMMAND (as COMMAND COUNT: its reply is short) instead,
    and only keys of the queue's slot (the registry: :func:`_routed_calls`)."""
    token = PROBE_TOKEN
    argv = (token, scratch_key(keys), keys.channel, *_typed_keys(keys, worker_id))
    waits = [("wait", "", ("WAIT", 0, 0))] if wait_for_replicas else []
    if keys.cluster:
        setup: list[tuple[str, str, tuple[Any, ...]]] = [
            ("asking", "", ("ASKING",)),  # only flags the next command (PING)
            ("ping", "", ("PING",)),
            ("cluster|slots", "", ("CLUSTER", "SLOTS")),
            ("command", "", ("COMMAND", "COUNT")),
            ("script|load", "", ("SCRIPT", "LOAD", _CLUSTER_PROBE_SOURCE)),
            ("evalsha", "", ("EVALSHA", _CLUSTER_PROBE_SHA, 0, *argv)),
            ("eval", "", ("EVAL", "return 0", 0)),
        ]
        registry: list[tuple[str, str, tuple[Any, ...]]] = []
    else:
        setup = [
            ("ping", "", ("PING",)),
            ("script|exists", "", ("SCRIPT", "EXISTS", _PROBE_SHA)),
            ("script|load", "", ("SCRIPT", "LOAD", _PROBE_SOURCE)),
            ("evalsha", "", ("EVALSHA", _PROBE_SHA, 0, *argv)),
            ("eval", "", ("EVAL", "return 0", 0)),
            ("scan", "", ("SCAN", 0, "MATCH", acks_pattern(_glob_escape(keys.namespace), token), "COUNT", 1)),
        ]
        registry = [("smembers", keys.registry, ("SMEMBERS", keys.registry))]
    return [
        *waits,
        *setup,
        ("smembers", keys.acks(worker_id), ("SMEMBERS", keys.acks(worker_id))),
        ("lrange", keys.legacy_dq, ("LRANGE", keys.legacy_dq, 1, 0)),
        ("hmget", keys.legacy_dq_msgs, ("HMGET", keys.legacy_dq_msgs, token)),
        ("zrangebyscore", keys.heartbeats, ("ZRANGEBYSCORE", keys.heartbeats, 1, 0)),
        ("zrem", keys.heartbeats, ("ZREM", keys.heartbeats, token)),
        ("zcard", keys.timeout_zset, ("ZCARD", keys.timeout_zset)),
        ("hexists", keys.payloads, ("HEXISTS", keys.payloads, token)),
        ("zrange", keys.timeout_zset, ("ZRANGE", keys.timeout_zset, 1, 0)),
        ("time", "", ("TIME",)),
        *registry,
        ("zscore", keys.xq, ("ZSCORE", keys.xq, token)),
        ("hget", keys.xq_msgs, ("HGET", keys.xq_msgs, token)),
        ("hgetall", keys.subscribers, ("HGETALL", keys.subscribers)),
        ("hdel", keys.subscribers, ("HDEL", keys.subscribers, token)),
        (
            "pubsub|shardnumsub" if keys.cluster else "pubsub|numsub",
            keys.channel,
            ("PUBSUB", "SHARDNUMSUB" if keys.cluster else "NUMSUB", keys.channel),
        ),
        ("unlink", scratch_key(keys), ("UNLINK", scratch_key(keys))),
    ]


def _routed_calls(keys: QueueKeys) -> list[tuple[str, str, tuple[Any, ...]]]:
    """On a cluster: the calls on the namespace's queue registry, which lives in another
    slot than the queue's keys; sent through the cluster client. (SADD, which the
    heartbeat and the first send issue, is checked in the probe on the scratch key; SREM
    of a member no queue has checks write access to the registry.)"""
    return [
        ("smembers", keys.registry, ("SMEMBERS", keys.registry)),
        ("srem", keys.registry, ("SREM", keys.registry, PROBE_TOKEN)),
    ]


def _node_client(client: RedisCluster, keys: QueueKeys, worker_id: str) -> redis.Redis:
    """The client of the cluster node that owns the queue's slot (per ``client``'s slot
    map), after checking that every key the probe touches there is in that slot."""
    local = [keys.channel, scratch_key(keys), *_typed_keys(keys, worker_id)[1::2]]
    slots = {key_slot(key.encode()) for key in local}
    if len(slots) != 1:
        raise ValueError(f"The probe's keys of queue {keys.queue_name!r} span cluster slots: {sorted(local)}")
    return client.get_redis_connection(client.get_node_from_key(keys.channel))


def check_permissions(
    client: redis.Redis | RedisCluster,
    keys: QueueKeys,
    *,
    worker_id: str = PROBE_TOKEN,
    subscribe: bool = True,
    wait_for_replicas: bool = False,
    server_version: tuple[int, int, int] | None = None,
) -> None:
    """Check that ``client``'s user may run everything the broker does on one queue.

    Changes nothing: every command is tried in a form that reads, or writes a probe
    token that does not exist, or fails after the ACL check (see ``lua/probe.lua``).
    The one visible effect is a ``PUBLISH "0"`` on the queue's channel, which makes idle
    consumers of the queue fetch once. One round trip on a connection of its own (closed
    afterwards), plus, with ``subscribe``, SUBSCRIBE and
    UNSUBSCRIBE of the queue's channel on a pub/sub connection.

    On Redis Cluster (a :class:`redis.cluster.RedisCluster` client, and ``keys`` of the
    cluster layout: ``broker.keys(queue_name)`` of a cluster broker) the probe and the
    other calls run on the node that owns the queue's slot, with the queue's keys only
    (all in that slot), the queue registry's SMEMBERS and SREM go through the cluster
    client, and the subscription is checked with SSUBSCRIBE/SUNSUBSCRIBE on that node;
    the visible effect is an ``SPUBLISH "0"``.

    Parameters:
      client: The broker's client (``broker.client``).
      keys: The queue's key names (``broker.keys(queue_name)``).
      worker_id: Whose ack set to check (``broker.broker_id``); any id checks the same
        key pattern.
      subscribe: Also check the subscription (consumers need it; producers do not).
      wait_for_replicas: Also check WAIT (a broker with ``wait_for_replicas`` sends it).
      server_version: The server's version, for the rule the error quotes (see
        :func:`acl_rule`).

    Raises:
      MissingPermission: Naming every missing command, key and channel, and the rule.
      redis.ConnectionError, redis.TimeoutError: The server could not be reached.
      redis.ResponseError: A reply that is no ACL refusal and not expected (say, a
        server that runs no Lua, or on a cluster a redirect: the slot moved).
      ValueError: A cluster client with keys of the single-server layout, or the reverse.
    """
    cluster = isinstance(client, RedisCluster)
    if server_version is None:
        server_version = _asked_version(client)
    if cluster != keys.cluster:
        layout = "cluster" if keys.cluster else "single-server"
        raise ValueError(f"Keys of the {layout} layout with a {type(client).__name__} client; use broker.keys()")
    calls = _client_calls(keys, worker_id, wait_for_replicas)
    node = _node_client(cast(RedisCluster, client), keys, worker_id) if cluster else cast(redis.Redis, client)
    denials: list[tuple[str, str, str]] = []
    unchecked: list[str] = []
    probe_reply: Any = None
    pool = node.connection_pool
    try:
        connection = pool.get_connection()
    except NoPermissionError as e:
        # The connection setup itself was refused (SELECT of a database other than 0; on
        # a cluster, READONLY of a client that reads from replicas): nothing else can be
        # tried.
        every = rule_commands(wait_for_replicas=wait_for_replicas, cluster=cluster)
        refused = [("" if cluster else "select", "", str(e))]
        _raise(keys, refused, [c for c in every if c != "select"], wait_for_replicas, server_version)
    try:
        connection.send_packed_command(connection.pack_commands([call for _, _, call in calls]), check_health=False)
        for command, target, _ in calls:
            try:
                reply = connection.read_response()
            except NoPermissionError as e:
                denials.append((command, target, str(e)))
                continue
            except redis.ResponseError as e:
                if is_permission_error(e):
                    denials.append((command, target, str(e)))
                elif command == "evalsha" and "NOSCRIPT" in str(e):
                    unchecked.extend(_script_commands(cluster))  # SCRIPT LOAD was refused: no probe
                else:
                    raise
                continue
            if command == "evalsha":
                probe_reply = reply
    finally:
        # Never reuse it: it may hold unread replies after an error.
        connection.disconnect()
        pool.release(connection)

    if cluster:
        for command, target, call in _routed_calls(keys):
            try:
                client.execute_command(*call)
            except redis.ResponseError as e:
                if not is_permission_error(e):
                    raise
                denials.append((command, target, str(e)))

    if probe_reply is not None:
        flat, probe_unchecked = probe_reply
        for i in range(0, len(flat), 3):
            command, target, error = (_text(x) for x in flat[i : i + 3])
            denials.append((command, target, error))
        unchecked.extend(_text(x) for x in probe_unchecked)
    elif not unchecked:
        unchecked.extend(_script_commands(cluster))  # EVALSHA itself was refused

    if subscribe:
        denial = _check_subscribe(node, keys.channel, sharded=cluster)
        if denial is not None:
            denials.append(denial)

    if denials or unchecked:
        _raise(keys, denials, unchecked, wait_for_replicas, server_version)


def _asked_version(client: redis.Redis | RedisCluster) -> tuple[int, int, int] | None:
    """The server's version (on a cluster the oldest node's), for the rule an error quotes;
    None when it cannot be asked (the error then quotes the rule for the newest servers)."""
    try:
        return min(version for _, version in server_versions(client).values())
    except (redis.RedisError, ValueError):
        return None


def _check_subscribe(client: redis.Redis, channel: str, sharded: bool = False) -> tuple[str, str, str] | None:
    """SUBSCRIBE and UNSUBSCRIBE ``channel`` (``sharded``: SSUBSCRIBE and SUNSUBSCRIBE,
    on the node of the channel's slot); returns the refusal, if any."""
    pubsub: Any = client.pubsub()
    kinds = ("ssubscribe", "sunsubscribe") if sharded else ("subscribe", "unsubscribe")
    try:
        for kind in kinds:
            try:
                getattr(pubsub, kind)(channel)
                _await_reply(pubsub, kind)
            except redis.ResponseError as e:
                if is_permission_error(e):
                    return (kind, channel, str(e))
                raise
        return None
    finally:
        pubsub.close()


def _await_reply(pubsub: Any, kind: str) -> None:
    deadline = time.monotonic() + SUBSCRIBE_TIMEOUT
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise redis.TimeoutError(f"no reply to {kind.upper()} within {SUBSCRIBE_TIMEOUT} s")
        item = pubsub.get_message(timeout=min(remaining, 0.5))
        if item is not None and item.get("type") == kind:
            return


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _raise(
    keys: QueueKeys,
    denials: list[tuple[str, str, str]],
    unchecked: list[str],
    wait_for_replicas: bool = False,
    server_version: tuple[int, int, int] | None = None,
) -> NoReturn:
    commands: set[str] = set()
    key_notes: dict[str, set[str]] = {}
    channels: set[str] = set()
    other: list[str] = []
    for command, target, error in denials:
        # Wordings: Valkey and Redis 7+ ("... to run the 'time' command", "No permissions
        # to access a key/channel"); Redis 6.2 ("... to access one of the keys/channels
        # used as arguments"; in scripts "can't run this command or subcommand", "can't
        # access at least one of the keys", the latter for channels too).
        match = _DENIED_COMMAND.search(error)
        if match:
            name = match.group(1).lower()
            # COMMAND COUNT stands for COMMAND (what the rule grants and redis-py sends).
            commands.add(command if name.startswith(f"{command}|") else name)
        elif "run this command" in error:
            commands.add(command)
        elif "channel" in error or (command in _CHANNEL_COMMANDS and "key" in error):
            channels.add(target)
        elif "key" in error:
            key_notes.setdefault(target, set()).add("read" if command in _READS else "write")
        else:
            other.append(f"{command} {target}: {error}".strip())
    missing_unchecked = sorted(set(unchecked) - commands)
    key_list = [f"{key} ({'/'.join(sorted(modes))})" for key, modes in sorted(key_notes.items())]
    parts: list[str] = []
    if commands:
        parts.append("missing commands: " + ", ".join(sorted(commands)))
    if key_list:
        parts.append("no access to keys: " + ", ".join(key_list))
    if channels:
        parts.append("no access to channels: " + ", ".join(sorted(channels)))
    if other:
        parts.append("other refusals: " + "; ".join(other))
    message = (
        f"The Redis user lacks permissions dramatiq-redisson needs on queue {keys.queue_name!r}: "
        + "; ".join(parts or ["none refused, but some could not be tried"])
        + "."
    )
    if set(rule_commands(wait_for_replicas=wait_for_replicas, cluster=keys.cluster)) - commands <= set(unchecked):
        message += " Nothing else could be checked: the connection could not be set up."
    elif set(_script_commands(keys.cluster)) <= set(unchecked):
        message += " The scripts' commands could not be checked: the probe script could not run."
    elif missing_unchecked:
        message += f" Not checked until those are granted: {', '.join(missing_unchecked)}."
    if scratch_key(keys) in key_notes:
        message += f" ({scratch_key(keys)} is a key the check itself uses, in the namespace's key pattern.)"
    rule = _rule_text(keys.namespace, wait_for_replicas, keys.cluster, server_version)
    where = " on every node of the cluster" if keys.cluster else ""
    message += f" Grant the least-privilege rule (see {DOCS}){where}: ACL SETUSER <user> {rule}"
    raise MissingPermission(
        message,
        commands=sorted(commands),
        keys=key_list,
        channels=sorted(channels),
        unchecked=missing_unchecked,
    )


def _rule_text(
    namespace: str,
    wait_for_replicas: bool = False,
    cluster: bool = False,
    server_version: tuple[int, int, int] | None = None,
) -> str:
    """:func:`acl_rule`, or the quoted tokens when the namespace has whitespace."""
    options: dict[str, Any] = {
        "wait_for_replicas": wait_for_replicas,
        "cluster": cluster,
        "server_version": server_version,
    }
    try:
        return acl_rule(namespace, **options)
    except ValueError:
        return " ".join(repr(token) for token in acl_tokens(namespace, **options))
