"""Least privilege: the ACL rule a deployment should give the broker's Redis user.

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

:func:`check_permissions <dramatiq_redisson.check_permissions>` (``connection._permissions``)
tells, in one error, everything a user lacks of it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .._keys import channels_pattern

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
#: to that registry), its consumer (SMEMBERS, LRANGE, HMGET, ZRANGEBYSCORE, SCAN, ZREM; HGET
#: and HINCRBY when it puts back a message for an actor it has not declared),
#: ``DelayedQueue`` (ZCARD, HEXISTS, ZRANGE, HMGET) and ``DeadLetters`` (ZCARD, ZRANGE,
#: HMGET, ZSCORE, HGET). No MULTI/EXEC: on a full server Redis before 7.4 and Valkey 7.2
#: refuse every command queued in a transaction, reads included.
CLIENT_COMMANDS: tuple[str, ...] = (
    "hdel",
    "hexists",
    "hget",
    "hgetall",
    "hincrby",
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

#: How the hot consumer scripts run where the server has functions (Redis >= 7.0, Valkey;
#: ``scripts._library``): FCALL, and FUNCTION LOAD when the library is missing. Granted
#: from 7.0 on, so that a user with the rule is never refused them (each refusal is an
#: ``ACL LOG`` entry); not asked for by the probe: a user without them (a rule of an
#: earlier release) runs every script with EVALSHA, at a few percent more server CPU.
FUNCTION_COMMANDS: tuple[str, ...] = ("fcall", "function|load")

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
        | set(FUNCTION_COMMANDS)
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
#: single server; on a cluster each queue's call goes alone to its node), FCALL and
#: FUNCTION LOAD (a cluster's calls keep EVALSHA: see ``scripts._library``).
NOT_ON_CLUSTER: tuple[str, ...] = ("fcall", "function|load", "scan", "script|exists", "select")

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


@dataclass(frozen=True)
class RuleLayout:
    """What the rule differs in between one server and a cluster; :func:`rule_layout`
    picks one. ``name``: the layout's, in errors; ``commands``: every command granted
    (before the server version's connection commands), less ``never_sent`` (taken out
    again after those are added); ``script_commands``: what the Lua scripts issue;
    ``key_patterns``: ``str.format`` templates of the escaped namespace ``ns``;
    ``where``/``aside``: where the rule is to be applied, in texts that quote it."""

    name: str
    commands: tuple[str, ...]
    never_sent: tuple[str, ...]
    script_commands: tuple[str, ...]
    key_patterns: tuple[str, ...]
    where: str
    aside: str


ONE_SERVER_RULE = RuleLayout(
    name="single-server",
    commands=COMMANDS,
    never_sent=(),
    script_commands=SCRIPT_COMMANDS,
    key_patterns=("{ns}:*", "redisson_delay_queue*:{{{ns}:*}}"),
    where="",
    aside="",
)
CLUSTER_RULE = RuleLayout(
    name="cluster",
    commands=CLUSTER_COMMANDS,
    never_sent=NOT_ON_CLUSTER,
    script_commands=CLUSTER_SCRIPT_COMMANDS,
    key_patterns=("{ns}:*", "{{{ns}:*", "redisson_delay_queue*:{{{ns}:*}}"),
    where=" on every node of the cluster",
    aside=" (on every node of the cluster)",
)
#: The layouts by ``cluster`` (``acl_rule``'s argument, the key layout's flag).
_RULE_LAYOUTS = {False: ONE_SERVER_RULE, True: CLUSTER_RULE}


def rule_layout(cluster: bool) -> RuleLayout:
    """:data:`CLUSTER_RULE` for a cluster, else :data:`ONE_SERVER_RULE`."""
    return _RULE_LAYOUTS[bool(cluster)]


def rule_commands(
    *, wait_for_replicas: bool = False, cluster: bool = False, server_version: tuple[int, int, int] | None = None
) -> tuple[str, ...]:
    """The commands :func:`acl_rule` grants, sorted."""
    layout = rule_layout(cluster)
    commands = set(layout.commands) - set(CONNECTION_COMMANDS)
    commands |= set(connection_commands(server_version))
    commands -= set(layout.never_sent)
    if server_version is not None and server_version < (7, 0, 0):
        commands -= set(FUNCTION_COMMANDS)  # 6.2 has no functions (ACL SETUSER refuses the names)
    if wait_for_replicas:
        commands |= set(REPLICATION_COMMANDS)
    return tuple(sorted(commands))


#: Where the rule is explained.
DOCS = "'Least privilege' in docs/security.md of dramatiq-redisson"

_GLOB_SPECIAL = re.compile(r"([\\*?\[\]])")


def glob_escape(text: str) -> str:
    return _GLOB_SPECIAL.sub(r"\\\1", text)


def key_patterns(namespace: str = "dramatiq", *, cluster: bool = False) -> tuple[str, ...]:
    """The key patterns of a namespace: its Dramatiq keys (``ns:*``: queues, messages,
    acks, heartbeats, dead letters, legacy ``.DQ``) and its Redisson structures
    (``redisson_delay_queue*:{ns:*}``; the channel name is one of the script KEYS too).

    ``cluster``: the cluster layout's too, whose queue keys begin with the queue's hash
    tag (``{ns:*``: ``{ns:Q}``, ``{ns:Q}.msgs``, ``{ns:Q}.XQ``, ...); acks, heartbeats and
    the registry stay under ``ns:*``."""
    ns = glob_escape(namespace)
    return tuple(pattern.format(ns=ns) for pattern in rule_layout(cluster).key_patterns)


def channel_patterns(namespace: str = "dramatiq") -> tuple[str, ...]:
    """The pub/sub channel pattern of a namespace's queues."""
    return (channels_pattern(glob_escape(namespace)),)


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
