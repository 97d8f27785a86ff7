"""The Lua scripts, registered once per client, each behind one typed wrapper.

Every script's contract (KEYS, ARGV, return value) is the header of its file in
``lua/``. Scripts run through :class:`redis.commands.core.Script` (EVALSHA with a
reload on NOSCRIPT); the producer's scripts (offer, enqueue) resend a call that got
NOSCRIPT as EVAL with the source, which cannot miss (see :meth:`Scripts.stream`).
"""

from __future__ import annotations

import re
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from importlib import resources
from typing import Any, NoReturn, cast

import redis
from redis.commands.core import Script
from redis.exceptions import AskError, ClusterDownError, MovedError, NoScriptError, OutOfMemoryError, TryAgainError

from ._errors import NotReplicated
from ._keys import QueueKeys

_NAMES = (
    "offer",
    "transfer",
    "cancel",
    "clear",
    "enqueue",
    "fetch",
    "ack",
    "nack",
    "requeue",
    "maintenance",
    "bury",
    "heartbeat",
    "release",
    "peek",
    "reschedule",
    "count",
    "bulk",
    "scan",
    "dead",
    "stats",
    "pending",
)

#: A line ``-- include: _name.lua`` in a script stands for that file's text (shared
#: Lua functions; Redis scripts cannot load one another).
_INCLUDE = re.compile(rb"^-- include: (_[a-z_]+\.lua)$", re.MULTILINE)


def _read(file_name: str) -> bytes:
    return resources.files(__package__).joinpath("lua", file_name).read_bytes()


def _source(name: str) -> bytes:
    return _INCLUDE.sub(lambda m: _read(m.group(1).decode()).rstrip(b"\n"), _read(f"{name}.lua"))


_SOURCES = {name: _source(name) for name in _NAMES}

#: The same scripts for Redis Cluster: announcements go out with SPUBLISH (sharded
#: pub/sub), so that a queue's channels live on the node that owns its slot.
_CLUSTER_SOURCES = {name: src.replace(b'"PUBLISH"', b'"SPUBLISH"') for name, src in _SOURCES.items()}

#: Replies of a cluster node that mean the call did not run there: the slot moved or is
#: moving (MOVED, ASK, TRYAGAIN) or the cluster is failing over (CLUSTERDOWN).
_REDIRECTS = (MovedError, AskError, TryAgainError, ClusterDownError)

#: How often a call sent straight to a cluster node is sent again after a redirect, and
#: the pause (s) between two attempts: a slot migration or failover takes seconds.
_REDIRECT_ATTEMPTS = 40
_REDIRECT_PAUSE = 0.1


def _offer_keys(keys: QueueKeys) -> tuple[str, ...]:
    return (
        keys.timeout_zset,
        keys.backup_list,
        keys.payloads,
        keys.channel,
        keys.legacy_dq,
        keys.legacy_dq_msgs,
        keys.ready_msgs,
        keys.sent,
        *keys.dedupe_keys,
    )


#: An offer entry without a dedupe key: key, mode, ttl (see offer.lua).
_NO_KEY = ("", "", 0)


def _enqueue_keys(keys: QueueKeys) -> tuple[str, ...]:
    return (keys.ready, keys.ready_msgs, keys.channel, keys.sent, keys.idle)


def _enqueue_args(pairs: Sequence[tuple[str, bytes]], window_ms: int, in_flight: str = "") -> list[Any]:
    args: list[Any] = [window_ms, in_flight]
    for pair in pairs:
        args.extend(pair)
    return args


class TransferResult:
    """What one run of the transfer script did."""

    __slots__ = (
        "moved",
        "next_due_ms",
        "server_now_us",
        "dead",
        "lease_until_ms",
        "fetched",
        "registered",
        "lateness_ms",
        "replicas",
        "replicated",
    )

    def __init__(
        self,
        moved: int,
        next_due_ms: int | None,
        server_now_us: int,
        dead: int,
        lease_until_ms: int | None = None,
        fetched: list[tuple[str, bytes | None]] | None = None,
        registered: bool = False,
        lateness_ms: list[int] | None = None,
    ) -> None:
        self.moved = moved
        self.next_due_ms = next_due_ms
        self.server_now_us = server_now_us
        self.dead = dead
        #: ``None`` if the caller holds the transfer lease (it transferred), else when
        #: the other holder's lease ends (server epoch ms; nothing was transferred).
        self.lease_until_ms = lease_until_ms
        #: Moved messages handed straight to the caller (now in its ack set).
        self.fetched = fetched or []
        #: Whether the call registered the caller as idle (it took all there was).
        self.registered = registered
        #: For each moved message, how late it moved (ms after its due time, server clock).
        self.lateness_ms = lateness_ms or []
        #: With ``wait_for_replicas``: how many replicas acknowledged the call's writes
        #: (``None``: unknown, or no WAIT), and whether that is enough.
        self.replicas: int | None = None
        self.replicated = True

    @property
    def owner(self) -> bool:
        """Whether the caller holds the transfer lease."""
        return self.lease_until_ms is None

    def __repr__(self) -> str:
        return (
            f"TransferResult(moved={self.moved}, next_due_ms={self.next_due_ms}, "
            f"server_now_us={self.server_now_us}, dead={self.dead}, lease_until_ms={self.lease_until_ms})"
        )


class Outcomes(list[Any]):
    """The outcomes of :meth:`Scripts.stream`, one per call, and ``replicas``: how many
    replicas acknowledged the stream's writes when the broker waits for them (else
    ``None``)."""

    replicas: int | None = None


class Unanswered:
    """The outcome of a streamed call whose reply never came: the connection failed.

    ``sent`` tells whether the call went out (it may or may not have run: its outcome
    is unknown) or never left the client (it did not run).
    """

    __slots__ = ("error", "sent")

    def __init__(self, error: Exception, *, sent: bool) -> None:
        self.error = error
        self.sent = sent

    def __repr__(self) -> str:
        return f"Unanswered({self.error!r}, sent={self.sent})"


#: A failed connection: the replies still due on it are lost.
_CONNECTION_ERRORS = (redis.ConnectionError, redis.TimeoutError, OSError)


#: How Redis 6.2 words a script's write refused at the ``maxmemory`` limit inside the
#: script's error ("ERR Error running script (call to f_…): @user_script:N: … -OOM command
#: not allowed when used memory > 'maxmemory'."); 7.0 and later, and Valkey, pass the
#: ``-OOM`` error reply itself through, which redis-py raises as ``OutOfMemoryError``.
_SCRIPT_OOM = "-OOM command not allowed"


def script_error(error: redis.ResponseError) -> redis.ResponseError:
    """A script's error reply as the error the server meant: Redis 6.2's wrapped OOM (see
    :data:`_SCRIPT_OOM`) becomes :class:`redis.exceptions.OutOfMemoryError`, as on later
    servers, so one ``except OutOfMemoryError`` serves every version."""
    if isinstance(error, OutOfMemoryError) or _SCRIPT_OOM not in str(error):
        return error
    translated = OutOfMemoryError(*error.args)
    translated.__cause__ = error
    return translated


def _raise_script_error(error: redis.ResponseError) -> NoReturn:
    translated = script_error(error)
    if translated is error:
        raise error
    raise translated from error


class Scripts:
    """One client's registered scripts."""

    def __init__(
        self, client: Any, *, wait_for_replicas: int = 0, wait_timeout: int = 1000, cluster: bool = False
    ) -> None:
        self.client = client
        #: ``client`` is a :class:`redis.cluster.RedisCluster`: calls that must share a
        #: connection (streams, WAIT) go straight to the node that owns their slot.
        self.cluster = cluster
        self.sources = _CLUSTER_SOURCES if cluster else _SOURCES
        self._s: dict[str, Script] = {name: client.register_script(src) for name, src in self.sources.items()}
        #: After offer, enqueue, cancel and transfer: ``WAIT wait_for_replicas wait_timeout``
        #: on the connection that made the write (0: no WAIT).
        self.wait_for_replicas = wait_for_replicas
        self.wait_timeout = wait_timeout

    def _run_waiting(self, name: str, keys: Sequence[str], args: Sequence[Any]) -> tuple[Any, int | None]:
        """Run a script and ``WAIT`` for the replicas on the same connection (one
        pipeline, one round trip: WAIT counts the replicas that have this connection's
        writes); see :meth:`_run_pinned`.

        Returns the script's reply and how many replicas acknowledged the write, or
        ``None`` when the connection failed during the wait after the script's reply
        came (the write went through; its replication is unknown). Raises the script's
        error reply, or a connection error when the script's reply was lost."""
        return self._run_pinned(name, keys, args, wait=True)

    def _run_on_node(self, name: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        """On a cluster: run a script on the node that owns its slot (see
        :meth:`_run_pinned`); returns its reply."""
        return self._run_pinned(name, keys, args, wait=False)[0]

    def _run_pinned(self, name: str, keys: Sequence[str], args: Sequence[Any], *, wait: bool) -> tuple[Any, int | None]:
        """Run a script on one connection — the client's, or on a cluster one of the
        node that owns the keys' slot — followed by ``WAIT`` when ``wait``.

        NOSCRIPT (the call did not run) is answered by EVAL with the source. On a
        cluster a redirect (the call did not run there) reloads the slot map and sends
        the call again, for up to :data:`_REDIRECT_ATTEMPTS` times, then raises it; a
        lost node connection reloads the slot map and is raised (its outcome is
        unknown). Returns the reply and, with ``wait``, the replicas that acknowledged
        the write (else ``None``)."""
        attempts = 0
        by_sha = True
        while True:
            client = self.node_client(keys[0]) if self.cluster else self.client
            try:
                with client.pipeline(transaction=False) as pipe:
                    if by_sha:
                        pipe.evalsha(self._s[name].sha, len(keys), *keys, *args)
                    else:
                        pipe.eval(self.sources[name].decode(), len(keys), *keys, *args)
                    if wait:
                        pipe.wait(self.wait_for_replicas, self.wait_timeout)
                    replies = pipe.execute(raise_on_error=False)
            except _CONNECTION_ERRORS as e:
                if self.cluster:
                    # The node may be gone (a failover): the next call asks the
                    # cluster where the slot is now. This one's outcome is unknown.
                    self.redirected(e)
                raise
            reply = replies[0]
            if isinstance(reply, NoScriptError) and by_sha:
                by_sha = False
                continue
            if self.cluster and isinstance(reply, _REDIRECTS) and attempts < _REDIRECT_ATTEMPTS:
                attempts += 1
                self.redirected(reply)
                continue
            if isinstance(reply, redis.ResponseError):
                raise script_error(reply)
            if isinstance(reply, Exception):
                raise reply
            if not wait:
                return reply, None
            acked = replies[1]
            if isinstance(acked, Exception):
                if isinstance(acked, redis.ResponseError) and not isinstance(acked, redis.ConnectionError):
                    raise acked  # WAIT refused (ACL, a replica): the write is through, unconfirmed
                return reply, None
            return reply, int(acked)

    def node_client(self, key: str) -> redis.Redis:
        """On a cluster: a client of the primary that owns ``key``'s slot (per the
        cluster client's slot map)."""
        client = self.client
        return cast("redis.Redis", client.get_redis_connection(client.get_node_from_key(key)))

    def redirected(self, error: Exception | None = None) -> None:
        """A call sent straight to a cluster node was redirected (or its node is gone):
        pause briefly (a migration or failover is under way), then reload the slot map."""
        time.sleep(_REDIRECT_PAUSE if not isinstance(error, MovedError) else 0)
        try:
            self.client.nodes_manager.initialize()
        except (redis.RedisError, OSError):
            pass  # the next call fails the same way and tries again

    def _wait_checked(self, what: str, name: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        """:meth:`_run_waiting`, raising :class:`NotReplicated` (with the reply as
        ``reply``) when fewer replicas than asked acknowledged the write."""
        reply, acked = self._run_waiting(name, keys, args)
        if acked is None or acked < self.wait_for_replicas:
            error = NotReplicated.describe(what, acked, self.wait_for_replicas, self.wait_timeout)
            error.reply = reply  # type: ignore[attr-defined]
            raise error
        return reply

    def _run(self, name: str, keys: Sequence[str], args: Sequence[Any], client: Any = None) -> Any:
        try:
            return self._s[name](keys=list(keys), args=list(args), client=client or self.client)
        except redis.ResponseError as e:
            _raise_script_error(e)

    def _run_idempotent(self, name: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        """Run a script whose second run changes nothing the first did not (ack, nack,
        requeue, transfer, heartbeat): a connection found closed (a killed client, a
        server restart) is retried once on a fresh connection before the error is
        raised. A timeout is not retried: the server may be stalled."""
        try:
            return self._run(name, keys, args)
        except redis.ConnectionError:
            return self._run(name, keys, args)

    def _run_resending(self, name: str, keys: Sequence[str], args: Sequence[Any], client: Any = None) -> Any:
        """Run a producer script once: EVALSHA, and on NOSCRIPT (the call did not run:
        the script cache was flushed) EVAL with the source, which cannot miss and puts
        the script back in the cache. A pipeline ``client`` loads scripts itself."""
        if client is not None:
            return self._run(name, keys, args, client)
        if self.wait_for_replicas:
            return self._wait_checked(f"{name.capitalize()} script", name, keys, args)
        script = self._s[name]
        try:
            try:
                return self.client.evalsha(script.sha, len(keys), *keys, *args)
            except NoScriptError:
                return self.client.eval(self.sources[name].decode(), len(keys), *keys, *args)
        except redis.ResponseError as e:
            _raise_script_error(e)

    def offer(
        self,
        keys: QueueKeys,
        entries: Sequence[tuple[Any, ...]],
        *,
        absolute: bool = False,
        client: Any = None,
        replacing: str = "",
    ) -> Any:
        """Schedule ``(time_ms, sort_key, message_id, data, claim_id)`` entries, each
        optionally followed by ``dedupe_key, dedupe_mode, ttl_ms`` (see offer.lua).

        ``replacing``: the redis id of the in-flight copy of the message being retried,
        whose payload makes room for the retry on a full server (see offer.lua).

        Returns per entry the due time (epoch ms, -1 for a lost claim, -2 for a member
        already moved to the ready queue) or, for an entry its dedupe key kept out,
        ``[due time or -3, member, stored payload]`` of the message holding the key; or
        the pipeline when ``client`` is one."""
        args: list[Any] = ["abs" if absolute else f"move:{replacing}" if replacing else "rel"]
        for entry in entries:
            args.extend(entry)
            if len(entry) == 5:
                args.extend(_NO_KEY)
        return self._run_resending("offer", _offer_keys(keys), args, client)

    def offer_calls(self, calls: Sequence[tuple[QueueKeys, Sequence[Any]]]) -> list[Any]:
        """Offer calls of ``(keys, args)`` (offer.lua's ARGV, mode first), streamed (see
        :meth:`stream`); returns per call its outcome."""
        return self.stream("offer", [(_offer_keys(keys), args) for keys, args in calls])

    def offer_bulk(self, calls: Sequence[tuple[QueueKeys, int, Sequence[str | bytes]]]) -> list[Any]:
        """Schedule entries ``delay_ms`` from now, one script call per ``(keys, delay_ms,
        entries)``, streamed (see :meth:`stream`). ``entries`` is flat: message id,
        sort key + data, message id, sort key + data, ...

        Returns per call its outcome (see :meth:`stream`); a reply is
        ``[entries scheduled, their due time in epoch ms]``."""
        return self.stream(
            "offer", [(_offer_keys(keys), ("bulk", delay_ms, *entries)) for keys, delay_ms, entries in calls]
        )

    def enqueue_bulk(self, calls: Sequence[tuple[QueueKeys, Sequence[tuple[str, bytes]]]], window_ms: int) -> list[Any]:
        """Push ``(redis_message_id, data)`` pairs, one script call per ``(keys, pairs)``,
        streamed (see :meth:`stream`; duplicates are skipped as in :meth:`enqueue`).

        Returns per call its outcome; a reply is ``[queue length, ids pushed]``."""
        return self.stream("enqueue", [(_enqueue_keys(keys), _enqueue_args(pairs, window_ms)) for keys, pairs in calls])

    def stream(self, name: str, calls: Sequence[tuple[Sequence[str], Sequence[Any]]]) -> list[Any]:
        """Run many calls of one script on one connection, each sent as soon as it is
        packed and the replies read at the end: the server runs earlier calls while
        the client packs later ones (a pipeline packs everything before it sends).

        A call answered NOSCRIPT did not run (the script cache was flushed meanwhile):
        those calls, and only those, are sent again as EVAL with the script's source,
        which cannot miss. Nothing is raised for a failed call; the outcome of each
        call, in order, is one of:

        - its reply;
        - a :class:`redis.ResponseError`: the server ran it to an error reply (the
          producer scripts check every key before their first write, so such a call
          wrote nothing);
        - an :class:`Unanswered`: the connection failed before its reply was read
          (``sent``: it may have run; not sent: it did not run).

        With ``wait_for_replicas``, a ``WAIT`` follows the calls on their connection;
        the list's ``replicas`` says how many replicas acknowledged them (``None``:
        unknown, the connection failed).

        On a cluster, calls are streamed to each node that owns their slot (the
        ``replicas`` of the whole is the least of the nodes'); a call the node
        redirected (it did not run there) is then sent alone, following the slot.
        """
        if not self.cluster:
            return self._stream_on(self.client, name, calls)
        by_node: dict[str, list[int]] = defaultdict(list)
        clients: dict[str, redis.Redis] = {}
        for i, (keys, _) in enumerate(calls):
            node = self.client.get_node_from_key(keys[0])
            by_node[node.name].append(i)
            clients[node.name] = self.client.get_redis_connection(node)
        outcomes = Outcomes([None] * len(calls))
        replicas: list[int | None] = []
        for node_name, indexes in by_node.items():
            part = self._stream_on(clients[node_name], name, [calls[i] for i in indexes])
            replicas.append(part.replicas)
            for i, outcome in zip(indexes, part, strict=True):
                outcomes[i] = outcome
        resend = [
            i
            for i, outcome in enumerate(outcomes)
            if isinstance(outcome, _REDIRECTS) or (isinstance(outcome, Unanswered) and not outcome.sent)
        ]
        if resend or any(isinstance(outcome, Unanswered) for outcome in outcomes):
            # A slot moved or a node is gone: ask the cluster where the slots are now.
            first = outcomes[resend[0]] if resend else None
            self.redirected(first if isinstance(first, Exception) else None)
        for i in resend:
            keys, args = calls[i]
            outcomes[i] = self._resend(name, keys, args, replicas)
        if self.wait_for_replicas:
            outcomes.replicas = None if None in replicas else min(cast("list[int]", replicas), default=None)
        return outcomes

    def _resend(self, name: str, keys: Sequence[str], args: Sequence[Any], replicas: list[int | None]) -> Any:
        """One call of a cluster stream that did not run on the node it went to, sent
        alone (with its WAIT); returns its outcome as :meth:`stream` does."""
        try:
            if self.wait_for_replicas:
                reply, acked = self._run_waiting(name, keys, args)
                replicas.append(acked)
                return reply
            return self._run_on_node(name, keys, args)
        except _CONNECTION_ERRORS as e:
            return Unanswered(e, sent=True)
        except redis.ResponseError as e:
            return script_error(e)

    def _stream_on(
        self, client: redis.Redis, name: str, calls: Sequence[tuple[Sequence[str], Sequence[Any]]]
    ) -> Outcomes:
        """:meth:`stream` on one server (``client``)."""
        script = self._s[name]
        outcomes = Outcomes([None] * len(calls))
        pool = client.connection_pool
        try:
            connection = pool.get_connection()
        except _CONNECTION_ERRORS as e:
            return Outcomes([Unanswered(e, sent=False)] * len(calls))
        try:
            # Load the script in the same stream, so that EVALSHA normally finds it.
            load = [connection.pack_command("SCRIPT", "LOAD", script.script)]
            sha, source = script.sha, script.script
            noscript, alive = self._exchange(
                connection, calls, range(len(calls)), outcomes, lambda k, a: ("EVALSHA", sha, len(k), *k, *a), load
            )
            if noscript and alive:
                _, alive = self._exchange(
                    connection, calls, noscript, outcomes, lambda k, a: ("EVAL", source, len(k), *k, *a), []
                )
            if self.wait_for_replicas:
                outcomes.replicas = self._wait_on(connection) if alive else None
        except BaseException:
            # Replies may be left unread on this connection: never reuse it.
            connection.disconnect()
            raise
        finally:
            pool.release(connection)
        return outcomes

    def _wait_on(self, connection: Any) -> int | None:
        """``WAIT`` on ``connection`` (after its writes); ``None`` if the connection failed."""
        try:
            connection.send_command("WAIT", self.wait_for_replicas, self.wait_timeout, check_health=False)
            return int(connection.read_response())
        except _CONNECTION_ERRORS:
            connection.disconnect()
            return None

    @staticmethod
    def _exchange(
        connection: Any,
        calls: Sequence[tuple[Sequence[str], Sequence[Any]]],
        indexes: Sequence[int],
        outcomes: list[Any],
        command: Callable[[Sequence[str], Sequence[Any]], tuple[Any, ...]],
        preamble: list[Any],
    ) -> tuple[list[int], bool]:
        """Send ``preamble`` then ``command(keys, args)`` for each call of ``indexes``, read
        every reply and store each call's outcome. Returns the indexes answered NOSCRIPT
        and whether the connection is still usable.

        Replies already waiting are read between sends, so that when the connection
        fails, every reply that arrived before is known. On a connection error the
        connection is closed and every call without a reply gets an :class:`Unanswered`
        (``sent`` when its command went out, even part-way)."""
        noscript: list[int] = []
        preamble_due = len(preamble)
        sent = read = 0

        def read_next() -> None:
            nonlocal preamble_due, read
            if preamble_due:
                preamble_due -= 1
                try:
                    connection.read_response()
                except redis.ResponseError:
                    pass  # e.g. SCRIPT LOAD refused: EVALSHA then misses and EVAL follows
                return
            i = indexes[read]
            try:
                outcomes[i] = connection.read_response()
            except NoScriptError as e:
                outcomes[i] = e
                noscript.append(i)
            except redis.ResponseError as e:
                outcomes[i] = script_error(e)
            read += 1

        try:
            for packed in preamble:
                connection.send_packed_command(packed, check_health=False)
            for i in indexes:
                keys, args = calls[i]
                packed = connection.pack_command(*command(keys, args))
                sent += 1  # counted before it goes: a send that fails part-way may have gone
                connection.send_packed_command(packed, check_health=False)
                while (preamble_due or read < sent) and connection.can_read(timeout=0):
                    read_next()
            while preamble_due or read < sent:
                read_next()
        except _CONNECTION_ERRORS as e:
            connection.disconnect()
            for n, i in enumerate(indexes):
                if n >= read:
                    outcomes[i] = Unanswered(e, sent=n < sent)
            return noscript, False
        return noscript, True

    def transfer(
        self,
        keys: QueueKeys,
        *,
        limit: int,
        trim_budget: int,
        compact_step: int,
        compact_slack: int,
        token: str = "",
        lease_ms: int = 0,
        own_slots: int = 0,
        worker_id: str = "",
        listening: bool = False,
        window_ms: int = 0,
    ) -> TransferResult:
        """Move due entries if consumer ``token`` holds (or can take) the transfer lease
        for ``lease_ms``; without a token, move them regardless of the lease (see
        transfer.lua). ``own_slots``: how many moved messages the caller (of worker
        ``worker_id``) takes itself, handed off in the reply when the ready queue was
        empty (the rest wake idle consumers); ``listening``: it may be registered as idle;
        ``window_ms``: how long moved members stay remembered (not offered again).

        A call that may hand messages off is not retried after a lost reply (they would
        sit in the ack set, unheld): the caller reconciles instead."""
        transfer_keys = (
            keys.timeout_zset,
            keys.backup_list,
            keys.payloads,
            keys.compact_list,
            keys.compact_cursor,
            keys.ready,
            keys.ready_msgs,
            keys.xq,
            keys.xq_msgs,
            keys.lease,
            keys.consumers,
            keys.idle,
            keys.channel,
            keys.acks(worker_id),
            keys.sent,
            *keys.dedupe_keys,
        )
        args = (
            limit,
            trim_budget,
            compact_step,
            compact_slack,
            token,
            lease_ms,
            own_slots,
            "1" if listening else "",
            window_ms,
        )
        replicas: int | None = None
        if self.wait_for_replicas:
            try:
                reply, replicas = self._run_waiting("transfer", transfer_keys, args)
            except redis.ConnectionError:
                if own_slots:
                    raise
                reply, replicas = self._run_waiting("transfer", transfer_keys, args)
        else:
            run = self._run if own_slots else self._run_idempotent
            reply = run("transfer", transfer_keys, args)
        moved, next_due, now_us, dead, lease_until, handed, registered, lateness = reply
        result = TransferResult(
            int(moved),
            None if int(next_due) < 0 else int(next_due),
            int(now_us),
            int(dead),
            int(lease_until) or None,
            [(handed[i].decode(), handed[i + 1]) for i in range(0, len(handed), 2)],
            bool(registered),
            [int(late) for late in lateness],
        )
        if self.wait_for_replicas:
            result.replicas = replicas
            result.replicated = replicas is not None and replicas >= self.wait_for_replicas
        return result

    def release(self, keys: QueueKeys, token: str) -> int:
        """A consumer leaves: unregister it, hand its transfer lease over (release.lua)."""
        return int(self._run_idempotent("release", (keys.lease, keys.consumers, keys.idle, keys.channel), (token,)))

    def cancel(self, keys: QueueKeys, message_ids: Sequence[str], *, by_key: bool = False) -> int:
        """Unschedule messages by id (``by_key``: the messages holding these dedupe keys);
        returns how many were scheduled. With ``wait_for_replicas``, raises
        :class:`NotReplicated` (``reply``: that count) when too few replicas acknowledged
        the cancel in time."""
        cancel_keys = (keys.timeout_zset, keys.payloads, keys.dedupe, keys.keyed)
        args = ("key" if by_key else "id", *message_ids)
        if self.wait_for_replicas:
            return int(self._wait_checked("Cancel", "cancel", cancel_keys, args))
        return int(self._run("cancel", cancel_keys, args))

    def clear(self, keys: QueueKeys, client: Any = None) -> Any:
        """Returns how many were scheduled, or the pipeline when ``client`` is one."""
        return self._run("clear", keys.scheduled_keys, (), client)

    def enqueue(
        self,
        keys: QueueKeys,
        entries: Sequence[tuple[str, bytes]],
        window_ms: int,
        client: Any = None,
        replacing: str = "",
    ) -> Any:
        """Push ``(redis_message_id, data)`` pairs, skipping ids already queued, in flight
        or enqueued within the last ``window_ms``; ``replacing`` as for :meth:`offer`.
        Returns ``[queue length, ids pushed]``, or the pipeline when ``client`` is one."""
        args = _enqueue_args(entries, window_ms, replacing)
        return self._run_resending("enqueue", _enqueue_keys(keys), args, client)

    def fetch(self, keys: QueueKeys, worker_id: str, count: int, token: str = "") -> list[tuple[str, bytes | None]]:
        """Take up to ``count`` ready messages; with a ``token``, a short fetch registers
        that consumer as idle (woken on its wake channel, see fetch.lua)."""
        flat = self._run(
            "fetch",
            (keys.ready, keys.ready_msgs, keys.acks(worker_id), keys.heartbeats, keys.idle),
            (count, worker_id, token),
        )
        return [(flat[i].decode(), flat[i + 1]) for i in range(0, len(flat), 2)]

    def ack(self, keys: QueueKeys, worker_id: str, redis_message_id: str) -> int:
        return int(
            self._run_idempotent(
                "ack", (keys.acks(worker_id), keys.ready_msgs, keys.heartbeats), (redis_message_id, worker_id)
            )
        )

    def nack(self, keys: QueueKeys, worker_id: str, redis_message_id: str, final: bytes | None = None) -> int:
        return int(
            self._run_idempotent(
                "nack",
                (keys.acks(worker_id), keys.ready_msgs, keys.xq, keys.xq_msgs, keys.heartbeats),
                (redis_message_id, worker_id) if final is None else (redis_message_id, worker_id, final),
            )
        )

    def requeue(self, keys: QueueKeys, worker_id: str, redis_message_ids: Sequence[str]) -> int:
        return int(
            self._run_idempotent(
                "requeue",
                (keys.acks(worker_id), keys.ready_msgs, keys.ready, keys.idle, keys.channel),
                redis_message_ids,
            )
        )

    def maintenance(
        self, keys: QueueKeys, dead_workers: Sequence[str], *, dead_message_ttl_ms: int, expire_limit: int
    ) -> tuple[int, int]:
        requeued, expired = self._run(
            "maintenance",
            (
                keys.ready,
                keys.ready_msgs,
                keys.xq,
                keys.xq_msgs,
                keys.legacy_dq,
                keys.legacy_dq_msgs,
                *(k for w in dead_workers for k in (keys.acks(w), keys.legacy_dq_acks(w))),
            ),
            (dead_message_ttl_ms, expire_limit),
        )
        return int(requeued), int(expired)

    def bury_legacy(self, keys: QueueKeys, ids: Sequence[str]) -> int:
        """Move undecodable entries of the built-in ``.DQ`` queue to the dead letters."""
        return int(self._run("bury", (keys.legacy_dq, keys.legacy_dq_msgs, keys.xq, keys.xq_msgs), ids))

    def peek(self, keys: QueueKeys, message_id: str, *, by_key: bool = False) -> tuple[int, bytes, str] | None:
        """A scheduled message's due time (epoch ms), stored payload and message id, or
        ``None``; ``by_key``: ``message_id`` is a dedupe key (the message holding it)."""
        due, stored, found = self._run(
            "peek", (keys.timeout_zset, keys.payloads, keys.dedupe), (message_id, "key" if by_key else "id")
        )
        return None if int(due) < 0 or stored is None else (int(due), stored, found.decode())

    def reschedule(self, keys: QueueKeys, message_id: str, mode: str, value_ms: int) -> int | None:
        """New due time ``"in"`` ms from the server's now or ``"at"`` epoch ms; returns it,
        or ``None`` when the message is not scheduled."""
        due = int(
            self._run("reschedule", (keys.timeout_zset, keys.payloads, keys.channel), (message_id, mode, value_ms))
        )
        return None if due < 0 else due

    def count(self, keys: QueueKeys, mode: str, value_ms: int = 0) -> int:
        """Scheduled messages: ``"all"``, due ``"before"`` an epoch ms, or ``"overdue"``
        by more than ``value_ms`` on the server clock."""
        return int(self._run("count", (keys.timeout_zset,), (mode, value_ms)))

    def bulk(self, keys: QueueKeys, action: str, batch: int, members: Sequence[bytes | str] = ()) -> int:
        """``"promote"`` or ``"remove"`` up to ``batch`` of the earliest scheduled entries,
        or those of ``members`` still scheduled (bulk.lua); returns how many."""
        return int(
            self._run(
                "bulk",
                (keys.timeout_zset, keys.payloads, keys.channel, keys.dedupe, keys.keyed),
                (action, batch, *members),
            )
        )

    def scan(
        self, keys: QueueKeys, size: int, after: tuple[bytes, bytes] | None
    ) -> tuple[list[tuple[bytes, int, bytes | None]], tuple[bytes, bytes] | None]:
        """A page of ``(member, due, stored payload or None)`` after the cursor ``after``
        (``(due, member)`` as bytes; ``None``: from the head), and the next cursor
        (``None`` at the end)."""
        due, member = after if after is not None else (b"", b"")
        flat, next_due, next_member = self._run("scan", (keys.timeout_zset, keys.payloads), (size, due, member))
        page = [(flat[i], int(float(flat[i + 1])), flat[i + 2]) for i in range(0, len(flat), 3)]
        return page, ((next_due, next_member) if next_due else None)

    def dead(self, keys: QueueKeys, action: str, batch: int, ids: Sequence[str] = ()) -> int:
        """``"requeue"`` or ``"remove"`` dead letters, by id or the oldest ``batch``
        (dead.lua); returns how many left the dead letters."""
        return int(
            self._run(
                "dead",
                (keys.xq, keys.xq_msgs, keys.ready, keys.ready_msgs, keys.idle, keys.channel),
                (action, batch, *ids),
            )
        )

    def stats(self, keys: QueueKeys, grace_ms: int, live_ms: int, client: Any = None) -> Any:
        """One queue's counts (stats.lua's reply), or the pipeline when ``client`` is one."""
        return self._run(
            "stats",
            (
                keys.ready,
                keys.ready_msgs,
                keys.timeout_zset,
                keys.xq,
                keys.lease,
                keys.consumers,
                keys.legacy_dq,
            ),
            (grace_ms, live_ms),
            client,
        )

    def pending(self, keys: QueueKeys) -> int:
        """Scheduled + ready + in flight + built-in delayed messages of a queue (pending.lua)."""
        return int(self._run("pending", (keys.timeout_zset, keys.ready_msgs, keys.legacy_dq_msgs), ()))

    def heartbeat(self, keys: QueueKeys, worker_id: str) -> int:
        """Mark ``worker_id`` alive (runs on a full server too) and list the queue in the
        namespace's registry; returns the server time, epoch ms. On a cluster the
        registry lives in another slot: it is written by a command of its own."""
        if keys.cluster:
            now_ms = int(self._run_idempotent("heartbeat", (keys.heartbeats,), (worker_id,)))
            self.client.sadd(keys.registry, keys.queue_name)
            return now_ms
        return int(self._run_idempotent("heartbeat", (keys.heartbeats, keys.registry), (worker_id, keys.queue_name)))
