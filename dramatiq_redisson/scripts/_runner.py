"""How the broker's scripts run: EVALSHA (EVAL on NOSCRIPT), a pipelined ``WAIT`` on the
connection that wrote, calls pinned to the cluster node of their slot (redirects followed),
and many calls of one script streamed over one connection.

:class:`ScriptRunner` knows nothing about any particular script: :class:`dramatiq_redisson.scripts._calls.Scripts`
adds one typed wrapper per script on top of it. Its outcomes for a stream of calls are an
:class:`Outcomes` list of replies, error replies and :class:`Unanswered`. Redis 6.2's
wrapped out-of-memory reply is translated here (:func:`script_error`), so every caller sees
one :class:`redis.exceptions.OutOfMemoryError` on every server version.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from importlib import resources
from typing import Any, NoReturn, Protocol, cast

import redis
from redis.commands.core import Script
from redis.exceptions import AskError, ClusterDownError, MovedError, NoScriptError, OutOfMemoryError, TryAgainError

from .._errors import NotReplicated
from .._logs import logger_for
from ..connection._topology import Topology, topology_for
from ._direct_calls import DirectCalls

logger = logger_for("scripts")

#: A line ``-- include: <name>.lua`` in a script stands for the text of
#: ``lua/include/<name>.lua``: one shared Lua function, ``<name>``, and the local constants
#: it alone needs (Redis scripts cannot load one another). An include names the includes
#: it needs the same way; an indented line (inside a function's body: the flow's lazily
#: made functions, see ``flow_lib.lua``) writes the text in at its indentation.
_INCLUDE = re.compile(rb"^([ \t]*)-- include: ([a-z][a-z_]*\.lua)$", re.MULTILINE)


def _read(file_name: str) -> bytes:
    return resources.files(__package__).joinpath("lua").joinpath(file_name).read_bytes()


def read_script(name: str) -> bytes:
    """The text of ``lua/<name>.lua``, as stored (its includes not written in)."""
    return _read(f"{name}.lua")


def split_includes(text: bytes) -> tuple[bytes, bytes]:
    """A script's text as ``(its include lines outside any body, the rest)``; raises
    :class:`ValueError` for an include written inside a body (an indented line), which
    cannot be moved out of it."""
    lines = list(_INCLUDE.finditer(text))
    if any(match.group(1) for match in lines):
        raise ValueError("an include written inside a body cannot be moved out of it")
    return b"\n".join(match.group(0) for match in lines), _INCLUDE.sub(b"", text)


def read_include(file_name: str) -> bytes:
    """The text of ``lua/include/<file_name>`` (one shared function), as stored."""
    return resources.files(__package__).joinpath("lua").joinpath("include").joinpath(file_name).read_bytes()


def load_source(name: str) -> bytes:
    """The text of ``lua/<name>.lua`` with its includes written in (see :func:`expand_includes`)."""
    return expand_includes(read_script(name))


def expand_includes(text: bytes) -> bytes:
    """A script's text with its includes written in: each include once, where it first
    appears, its dependencies (the includes it names) before it; a later line for the same
    include says it is included above. The result depends on the texts alone, so a
    script's SHA is the same in every process.

    A function written in inside another function's body (an indented include line) is
    seen only there: naming it again outside that body raises :class:`ValueError` (name it
    outside first)."""
    seen: dict[bytes, tuple[bytes, ...]] = {}

    def expand(text: bytes, file_name: bytes, scope: tuple[bytes, ...]) -> bytes:
        def include(match: re.Match[bytes]) -> bytes:
            indent, included = match.group(1), match.group(2)
            inner = scope + (file_name,) if indent else scope
            if included in seen:
                if inner[: len(seen[included])] != seen[included]:
                    raise ValueError(
                        f"{included.decode()} is written in inside the body of {seen[included][-1].decode()} "
                        f"and named again outside it (in {file_name.decode()}): include it outside first"
                    )
                return indent + b"-- (" + included + b" is included above)"
            seen[included] = inner
            body = expand(read_include(included.decode()), included, inner).rstrip(b"\n")
            if indent:
                body = b"\n".join(indent + line if line else line for line in body.split(b"\n"))
            return body

        return _INCLUDE.sub(include, text)

    return expand(text, b"<script>", ())


class Library(Protocol):
    """A function library the runner calls some scripts through (built by
    :mod:`dramatiq_redisson.scripts._library`): its ``name``, its ``source`` (what FUNCTION
    LOAD takes) and ``functions``, script name -> the function that runs it."""

    @property
    def name(self) -> str: ...

    @property
    def source(self) -> bytes: ...

    @property
    def functions(self) -> Mapping[str, str]: ...


#: :meth:`ScriptRunner._fcall`'s word for: the call did not run as a function (EVALSHA it).
_NOT_RUN = object()

#: Replies to FUNCTION LOAD or FCALL itself that mean the server cannot run functions for
#: this user: no such command (Redis 6.2) or an ACL rule without it. (A refusal of a
#: command inside a function names that command, not these.)
_UNAVAILABLE = re.compile(r"(unknown command|no permissions to run the) [`'\"]?(fcall|function)", re.IGNORECASE)

#: FCALL's NOSCRIPT: the library is not (or no longer) loaded; the call did not run.
FUNCTION_NOT_FOUND = "Function not found"

#: FUNCTION LOAD's reply when a library of that name is loaded already.
_LOADED_MEANWHILE = "already exists"


def unavailable(error: Exception) -> bool:
    """Whether ``error`` (a reply to FUNCTION LOAD or FCALL) says the server cannot run
    functions for this user: no functions (Redis 6.2) or an ACL rule without them."""
    return bool(_UNAVAILABLE.search(str(error)))


#: Replies of a cluster node that mean the call did not run there: the slot moved or is
#: moving (MOVED, ASK, TRYAGAIN) or the cluster is failing over (CLUSTERDOWN).
_REDIRECTS = (MovedError, AskError, TryAgainError, ClusterDownError)


#: How often a call sent straight to a cluster node is sent again after a redirect, and
#: the pause (s) between two attempts: a slot migration or failover takes seconds.
_REDIRECT_ATTEMPTS = 40


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


class ScriptRunner:
    """Runs registered scripts (``sources``: name -> Lua text) on one client."""

    def __init__(
        self,
        client: Any,
        sources: Mapping[str, bytes],
        *,
        wait_for_replicas: int = 0,
        wait_timeout: int = 1000,
        topology: Topology | None = None,
        library: Library | None = None,
    ) -> None:
        self.client = client
        #: Where a call runs (see :mod:`dramatiq_redisson.connection._topology`): calls that must share a connection
        #: (streams, WAIT) go straight to the server (on a cluster the node) of their slot.
        self.topology = topology or topology_for(client)
        self.sources = {name: self.topology.script_source(src) for name, src in sources.items()}
        self._s: dict[str, Script] = {name: client.register_script(src) for name, src in self.sources.items()}
        #: After offer, enqueue, cancel and transfer: ``WAIT wait_for_replicas wait_timeout``
        #: on the connection that made the write (0: no WAIT).
        self.wait_for_replicas = wait_for_replicas
        self.wait_timeout = wait_timeout
        #: The script calls' own connections (see :mod:`dramatiq_redisson.scripts._direct_calls`), or ``None``: a
        #: cluster client (or a pipeline, a single-connection client) keeps redis-py's path.
        self.direct = DirectCalls(client) if DirectCalls.suits(client) else None
        #: The function library some scripts run from on the direct path (``library``; see
        #: :mod:`dramatiq_redisson.scripts._library`), or ``None``: EVALSHA for every script (no
        #: direct path, a topology that runs another text of the scripts than the library's,
        #: or, found at the first call, a server or user without functions).
        self.library = (
            library
            if library is not None and self.direct and self.topology.script_source(library.source) == library.source
            else None
        )

    def close(self) -> None:
        """Disconnect the script calls' own connections (the client's are its owner's)."""
        if self.direct is not None:
            self.direct.close()

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
            client = self.topology.node(keys[0])
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
                # On a cluster the node may be gone (a failover): the next call asks
                # where the slot is now. This one's outcome is unknown.
                self.topology.follow(e)
                raise
            reply = replies[0]
            if isinstance(reply, NoScriptError) and by_sha:
                by_sha = False
                continue
            if isinstance(reply, _REDIRECTS) and attempts < _REDIRECT_ATTEMPTS and self.topology.follow(reply):
                attempts += 1
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
            if self.direct is not None and client is None:
                library = self.library
                if library is not None and name in library.functions:
                    reply = self._fcall(library, name, keys, args)
                    if reply is not _NOT_RUN:
                        return reply
                script = self._s[name]
                try:
                    return self.direct.call("EVALSHA", script.sha, len(keys), *keys, *args)
                except NoScriptError:
                    # Flushed from the server's cache: load it again, as redis-py's Script does.
                    self.client.script_load(script.script)
                    return self.direct.call("EVALSHA", script.sha, len(keys), *keys, *args)
            return self._s[name](keys=list(keys), args=list(args), client=client or self.client)
        except redis.ResponseError as e:
            _raise_script_error(e)

    def _fcall(self, library: Library, name: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        """Run a script as its function of ``library`` (FCALL); the library is loaded when
        the server does not have it (a first call, a restarted or flushed server).
        Returns :data:`_NOT_RUN` when the server or the user cannot run functions (then
        every later call takes EVALSHA: :attr:`library` is dropped) or the library could
        not be loaded now; raises the function's error reply."""
        assert self.direct is not None
        command = ("FCALL", library.functions[name], len(keys), *keys, *args)
        try:
            return self.direct.call(*command)
        except redis.ResponseError as e:
            if unavailable(e):
                self._without_library(e)
                return _NOT_RUN
            if FUNCTION_NOT_FOUND not in str(e):
                raise
        # Not loaded (the call did not run): load it, then call again. Without REPLACE:
        # a library of that name is this text (its name is the text's digest), so one that
        # another process loaded meanwhile is as good.
        try:
            self.direct.call("FUNCTION", "LOAD", library.source)
        except redis.ResponseError as e:
            if unavailable(e):
                self._without_library(e)
                return _NOT_RUN
            if _LOADED_MEANWHILE not in str(e):  # e.g. refused on a server at its maxmemory limit
                logger.debug("Function library %s not loaded (%s): EVALSHA this call.", library.name, e)
                return _NOT_RUN
        return self.direct.call(*command)

    def _without_library(self, error: Exception) -> None:
        if self.library is not None:
            self.library = None
            logger.info("Scripts run with EVALSHA: the server or this user cannot run functions (%s).", error)

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
                if self.direct is not None:
                    return self.direct.call("EVALSHA", script.sha, len(keys), *keys, *args)
                return self.client.evalsha(script.sha, len(keys), *keys, *args)
            except NoScriptError:
                if self.direct is not None:
                    return self.direct.call("EVAL", self.sources[name], len(keys), *keys, *args)
                return self.client.eval(self.sources[name].decode(), len(keys), *keys, *args)
        except redis.ResponseError as e:
            _raise_script_error(e)

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
        outcomes = Outcomes([None] * len(calls))
        replicas: list[int | None] = []
        for node, indexes in self.topology.by_node([keys[0] for keys, _ in calls]):
            part = self._stream_on(node, name, [calls[i] for i in indexes])
            replicas.append(part.replicas)
            for i, outcome in zip(indexes, part, strict=True):
                outcomes[i] = outcome
        resend = [
            i
            for i, outcome in enumerate(outcomes)
            if isinstance(outcome, _REDIRECTS) or (isinstance(outcome, Unanswered) and not outcome.sent)
        ]
        first = outcomes[resend[0]] if resend else None
        if (resend or any(isinstance(outcome, Unanswered) for outcome in outcomes)) and self.topology.follow(
            first if isinstance(first, Exception) else None
        ):
            # On a cluster a slot moved or a node is gone: the slot map was reloaded,
            # and the calls that did not run go again, each to where its slot is now.
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
