"""The probe that tells, in one error, everything the broker's Redis user is missing of
the least-privilege ACL rule (the rule itself: ``connection._acl_rule``, whose names are
importable from here too).

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
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from typing import Any, NoReturn

import redis
from redis.cluster import RedisCluster
from redis.crc import key_slot
from redis.exceptions import NoPermissionError

from .._errors import MissingPermission
from .._keys import QueueKeys, acks_pattern, lane_id
from ._acl_rule import DOCS, RuleLayout, acl_rule, acl_tokens, glob_escape, rule_commands, rule_layout
from ._server import server_versions
from ._topology import topology_for

#: What this module exports; ``DOCS``, ``acl_rule`` and ``acl_tokens`` come from ``connection._acl_rule``
#: (the rule), imported from here by earlier code.
__all__ = ["DOCS", "MissingPermission", "acl_rule", "acl_tokens", "check_permissions", "is_permission_error"]


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
#: are rewritten (``connection._topology.Cluster.script_source``).
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
        ("hash", keys.throttle_copies),
        ("hash", keys.schedules),
        ("hash", keys.chains),
        ("hash", keys.schedule_state),
        ("string", keys.paused),
        ("hash", keys.fetched),
        ("zset", keys.done),
        ("hash", keys.counts),
        ("hash", keys.progress),
        ("hash", keys.checkpoints),
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
    routed = {target for _, target, _ in acl_layout(keys.cluster).routed_calls(keys)}
    return [item for pair in pairs if pair[1] not in routed for item in pair]


Call = tuple[str, str, tuple[Any, ...]]


def _client_calls(keys: QueueKeys, worker_id: str, wait_for_replicas: bool = False) -> list[Call]:
    """``(command, target, arguments)``: every call the broker makes from Python, in a
    harmless form, then the probe script. ``wait_for_replicas``: WAIT too (``WAIT 0 0`` returns at once).

    On a cluster (``keys.cluster``) the calls all go to the node of the queue's slot: no
    SCAN, SELECT or SCRIPT EXISTS (a cluster broker sends none), the cluster client's
    own ASKING, CLUSTER SLOTS and COMMAND (as COMMAND COUNT: its reply is short) instead,
    and only keys of the queue's slot (the registry: :func:`_routed_calls`)."""
    layout = acl_layout(keys.cluster)
    token = PROBE_TOKEN
    argv = (token, scratch_key(keys), keys.channel, *_typed_keys(keys, worker_id))
    waits: list[Call] = [("wait", "", ("WAIT", 0, 0))] if wait_for_replicas else []
    return [
        *waits,
        *layout.setup_calls(keys, argv),
        ("smembers", keys.acks(worker_id), ("SMEMBERS", keys.acks(worker_id))),
        ("lrange", keys.legacy_dq, ("LRANGE", keys.legacy_dq, 1, 0)),
        ("hmget", keys.legacy_dq_msgs, ("HMGET", keys.legacy_dq_msgs, token)),
        ("zrangebyscore", keys.heartbeats, ("ZRANGEBYSCORE", keys.heartbeats, 1, 0)),
        ("zrem", keys.heartbeats, ("ZREM", keys.heartbeats, token)),
        ("zcard", keys.timeout_zset, ("ZCARD", keys.timeout_zset)),
        ("hexists", keys.payloads, ("HEXISTS", keys.payloads, token)),
        ("zrange", keys.timeout_zset, ("ZRANGE", keys.timeout_zset, 1, 0)),
        ("time", "", ("TIME",)),
        *layout.registry_calls(keys),
        ("zscore", keys.xq, ("ZSCORE", keys.xq, token)),
        ("hget", keys.xq_msgs, ("HGET", keys.xq_msgs, token)),
        ("hgetall", keys.subscribers, ("HGETALL", keys.subscribers)),
        ("hdel", keys.subscribers, ("HDEL", keys.subscribers, token)),
        (layout.numsub[0], keys.channel, (*layout.numsub[1], keys.channel)),
        ("unlink", scratch_key(keys), ("UNLINK", scratch_key(keys))),
    ]


def _one_server_setup(keys: QueueKeys, argv: tuple[Any, ...]) -> list[Call]:
    """The calls that open the probe on one server (SCAN of a worker's ack sets too)."""
    return [
        ("ping", "", ("PING",)),
        ("script|exists", "", ("SCRIPT", "EXISTS", _PROBE_SHA)),
        ("script|load", "", ("SCRIPT", "LOAD", _PROBE_SOURCE)),
        ("evalsha", "", ("EVALSHA", _PROBE_SHA, 0, *argv)),
        ("eval", "", ("EVAL", "return 0", 0)),
        ("scan", "", ("SCAN", 0, "MATCH", acks_pattern(glob_escape(keys.namespace), PROBE_TOKEN), "COUNT", 1)),
    ]


def _cluster_setup(keys: QueueKeys, argv: tuple[Any, ...]) -> list[Call]:
    """The calls that open the probe on a cluster node (with the cluster client's own)."""
    return [
        ("asking", "", ("ASKING",)),  # only flags the next command (PING)
        ("ping", "", ("PING",)),
        ("cluster|slots", "", ("CLUSTER", "SLOTS")),
        ("command", "", ("COMMAND", "COUNT")),
        ("script|load", "", ("SCRIPT", "LOAD", _CLUSTER_PROBE_SOURCE)),
        ("evalsha", "", ("EVALSHA", _CLUSTER_PROBE_SHA, 0, *argv)),
        ("eval", "", ("EVAL", "return 0", 0)),
    ]


def _registry_calls(keys: QueueKeys) -> list[Call]:
    """On one server: the queue registry's read, on the probe's connection."""
    return [("smembers", keys.registry, ("SMEMBERS", keys.registry))]


def _routed_calls(keys: QueueKeys) -> list[Call]:
    """On a cluster: the calls on the namespace's queue registry, which lives in another
    slot than the queue's keys; sent through the cluster client. (SADD, which the
    heartbeat and the first send issue, is checked in the probe on the scratch key; SREM
    of a member no queue has checks write access to the registry.)"""
    return [
        ("smembers", keys.registry, ("SMEMBERS", keys.registry)),
        ("srem", keys.registry, ("SREM", keys.registry, PROBE_TOKEN)),
    ]


def _none(keys: QueueKeys) -> list[Call]:
    return []


def _same_slot(keys: QueueKeys, worker_id: str) -> None:
    """Check that every key the probe touches on a cluster node is in the queue's slot."""
    local = [keys.channel, scratch_key(keys), *_typed_keys(keys, worker_id)[1::2]]
    slots = {key_slot(key.encode()) for key in local}
    if len(slots) != 1:
        raise ValueError(f"The probe's keys of queue {keys.queue_name!r} span cluster slots: {sorted(local)}")


@dataclass(frozen=True)
class AclLayout:
    """What the probe differs in between one server and a cluster (see the module);
    :func:`acl_layout` picks one by the key layout. ``rule``: the rule's own
    differences; ``subscribe_kinds``: the pub/sub object's methods that subscribe and
    unsubscribe; ``numsub``: the command counting a channel's subscribers, its rule name
    and words; ``setup_refusal``: what a refused connection setup stands for (a cluster
    connection's READONLY has no name in the rule); ``setup_calls``: the calls that open
    the probe, given its ``argv``; ``registry_calls``: calls on the probe's connection to
    namespace keys; ``routed_calls``: calls sent through the client (keys in another
    slot); ``check_probe_keys``: raises ``ValueError`` if the probe's keys are not all on
    one node."""

    rule: RuleLayout
    subscribe_kinds: tuple[str, str]
    numsub: tuple[str, tuple[str, ...]]
    setup_refusal: str
    setup_calls: Callable[[QueueKeys, tuple[Any, ...]], list[Call]]
    registry_calls: Callable[[QueueKeys], list[Call]]
    routed_calls: Callable[[QueueKeys], list[Call]]
    check_probe_keys: Callable[[QueueKeys, str], None]


ONE_SERVER_ACL = AclLayout(
    rule=rule_layout(False),
    subscribe_kinds=("subscribe", "unsubscribe"),
    numsub=("pubsub|numsub", ("PUBSUB", "NUMSUB")),
    setup_refusal="select",
    setup_calls=_one_server_setup,
    registry_calls=_registry_calls,
    routed_calls=_none,
    check_probe_keys=lambda keys, worker_id: None,  # one server: every key on the probe's connection
)
CLUSTER_ACL = AclLayout(
    rule=rule_layout(True),
    subscribe_kinds=("ssubscribe", "sunsubscribe"),
    numsub=("pubsub|shardnumsub", ("PUBSUB", "SHARDNUMSUB")),
    setup_refusal="",
    setup_calls=_cluster_setup,
    registry_calls=_none,
    routed_calls=_routed_calls,
    check_probe_keys=_same_slot,
)
#: The layouts by ``cluster`` (the key layout's flag, ``acl_rule``'s argument).
_ACL_LAYOUTS = {False: ONE_SERVER_ACL, True: CLUSTER_ACL}


def acl_layout(cluster: bool) -> AclLayout:
    """:data:`CLUSTER_ACL` for the cluster layout, else :data:`ONE_SERVER_ACL`."""
    return _ACL_LAYOUTS[bool(cluster)]


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
    topology = topology_for(client)
    layout = acl_layout(keys.cluster)
    if server_version is None:
        server_version = _asked_version(client)
    if acl_layout(topology.cluster) is not layout:
        raise ValueError(
            f"Keys of the {layout.rule.name} layout with a {type(client).__name__} client; use broker.keys()"
        )
    calls = _client_calls(keys, worker_id, wait_for_replicas)
    layout.check_probe_keys(keys, worker_id)
    node = topology.node(keys.channel)
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
        every = rule_commands(wait_for_replicas=wait_for_replicas, cluster=keys.cluster)
        refused = [(layout.setup_refusal, "", str(e))]
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
                    unchecked.extend(layout.rule.script_commands)  # SCRIPT LOAD was refused: no probe
                else:
                    raise
                continue
            if command == "evalsha":
                probe_reply = reply
    finally:
        # Never reuse it: it may hold unread replies after an error.
        connection.disconnect()
        pool.release(connection)

    for command, target, call in layout.routed_calls(keys):
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
        unchecked.extend(layout.rule.script_commands)  # EVALSHA itself was refused

    if subscribe:
        denial = _check_subscribe(node, keys.channel, layout.subscribe_kinds)
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


def _check_subscribe(
    client: redis.Redis, channel: str, kinds: tuple[str, str] = ONE_SERVER_ACL.subscribe_kinds
) -> tuple[str, str, str] | None:
    """Subscribe to ``channel`` and unsubscribe (``kinds``: SUBSCRIBE and UNSUBSCRIBE, or
    on a cluster SSUBSCRIBE and SUNSUBSCRIBE on the node of the channel's slot); returns
    the refusal, if any."""
    pubsub: Any = client.pubsub()
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
    layout = acl_layout(keys.cluster)
    granted = rule_commands(wait_for_replicas=wait_for_replicas, cluster=keys.cluster)
    if set(granted) - commands <= set(unchecked):
        message += " Nothing else could be checked: the connection could not be set up."
    elif set(layout.rule.script_commands) <= set(unchecked):
        message += " The scripts' commands could not be checked: the probe script could not run."
    elif missing_unchecked:
        message += f" Not checked until those are granted: {', '.join(missing_unchecked)}."
    if scratch_key(keys) in key_notes:
        message += f" ({scratch_key(keys)} is a key the check itself uses, in the namespace's key pattern.)"
    rule = _rule_text(keys.namespace, wait_for_replicas, keys.cluster, server_version)
    message += f" Grant the least-privilege rule (see {DOCS}){layout.rule.where}: ACL SETUSER <user> {rule}"
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
