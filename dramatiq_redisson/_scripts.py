"""The Lua scripts, registered once per client, each behind one typed wrapper.

Every script's contract (KEYS, ARGV, return value) is the header of its file in
``lua/``. Scripts run through :class:`redis.commands.core.Script` (EVALSHA with a
reload on NOSCRIPT).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from importlib import resources
from typing import Any

import redis
from redis.commands.core import Script

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
)


def _source(name: str) -> bytes:
    return resources.files(__package__).joinpath("lua", f"{name}.lua").read_bytes()


_SOURCES = {name: _source(name) for name in _NAMES}


def _offer_keys(keys: QueueKeys) -> tuple[str, ...]:
    return (keys.timeout_zset, keys.backup_list, keys.payloads, keys.channel, keys.legacy_dq, keys.legacy_dq_msgs)


class TransferResult:
    """What one run of the transfer script did."""

    __slots__ = ("moved", "next_due_ms", "server_now_us", "dead")

    def __init__(self, moved: int, next_due_ms: int | None, server_now_us: int, dead: int) -> None:
        self.moved = moved
        self.next_due_ms = next_due_ms
        self.server_now_us = server_now_us
        self.dead = dead

    def __repr__(self) -> str:
        return (
            f"TransferResult(moved={self.moved}, next_due_ms={self.next_due_ms}, "
            f"server_now_us={self.server_now_us}, dead={self.dead})"
        )


class Scripts:
    """One client's registered scripts."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self._s: dict[str, Script] = {name: client.register_script(src) for name, src in _SOURCES.items()}

    def _run(self, name: str, keys: Sequence[str], args: Sequence[Any], client: Any = None) -> Any:
        return self._s[name](keys=list(keys), args=list(args), client=client or self.client)

    def _run_idempotent(self, name: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        """Run a script whose second run changes nothing the first did not (ack, nack,
        requeue, transfer, heartbeat): a connection found closed (a killed client, a
        server restart) is retried once on a fresh connection before the error is
        raised. A timeout is not retried: the server may be stalled."""
        try:
            return self._run(name, keys, args)
        except redis.ConnectionError:
            return self._run(name, keys, args)

    def offer(
        self,
        keys: QueueKeys,
        entries: Sequence[tuple[int, str, str, bytes, str]],
        *,
        absolute: bool = False,
        client: Any = None,
    ) -> Any:
        """Schedule ``(time_ms, sort_key, message_id, data, claim_id)`` entries.

        Returns the due times (epoch ms, -1 for a lost claim), or the pipeline when
        ``client`` is one."""
        args: list[Any] = ["abs" if absolute else "rel"]
        for entry in entries:
            args.extend(entry)
        return self._run(
            "offer",
            _offer_keys(keys),
            args,
            client,
        )

    def offer_bulk(self, calls: Iterable[tuple[QueueKeys, int, Sequence[str | bytes]]]) -> list[Any]:
        """Schedule entries ``delay_ms`` from now, one script call per ``(keys, delay_ms,
        entries)``, streamed (see :meth:`stream`). ``entries`` is flat: message id,
        sort key + data, message id, sort key + data, ...

        Returns per call ``[entries scheduled, their due time in epoch ms]``."""
        return self.stream(
            "offer", ((_offer_keys(keys), ["bulk", delay_ms, *entries]) for keys, delay_ms, entries in calls)
        )

    def stream(self, name: str, calls: Iterable[tuple[Sequence[str], Sequence[Any]]]) -> list[Any]:
        """Run many calls of one script on one connection, each sent as soon as it is
        built and the replies read at the end: the server runs earlier calls while
        the client packs later ones (a pipeline packs everything before it sends).

        Raises:
          redis.ResponseError: The first error reply, after every reply was read.
        """
        script = self._s[name]
        self.client.script_load(script.script)  # EVALSHA below must find it
        pool = self.client.connection_pool
        connection = pool.get_connection()
        try:
            sent = 0
            for keys, args in calls:
                command = connection.pack_command("EVALSHA", script.sha, len(keys), *keys, *args)
                connection.send_packed_command(command, check_health=False)
                sent += 1
            replies: list[Any] = []
            error: redis.ResponseError | None = None
            for _ in range(sent):
                try:
                    replies.append(connection.read_response())
                except redis.ResponseError as e:
                    error = error or e
                    replies.append(e)
        except BaseException:
            # Replies may be left unread on this connection: never reuse it.
            connection.disconnect()
            raise
        finally:
            pool.release(connection)
        if error is not None:
            raise error
        return replies

    def transfer(
        self, keys: QueueKeys, *, limit: int, trim_budget: int, compact_step: int, compact_slack: int
    ) -> TransferResult:
        moved, next_due, now_us, dead = self._run_idempotent(
            "transfer",
            (
                keys.timeout_zset,
                keys.backup_list,
                keys.payloads,
                keys.compact_list,
                keys.compact_cursor,
                keys.ready,
                keys.ready_msgs,
                keys.xq,
                keys.xq_msgs,
            ),
            (limit, trim_budget, compact_step, compact_slack),
        )
        return TransferResult(int(moved), None if int(next_due) < 0 else int(next_due), int(now_us), int(dead))

    def cancel(self, keys: QueueKeys, message_ids: Sequence[str]) -> int:
        return int(self._run("cancel", (keys.timeout_zset, keys.payloads), message_ids))

    def clear(self, keys: QueueKeys, client: Any = None) -> Any:
        """Returns how many were scheduled, or the pipeline when ``client`` is one."""
        return self._run("clear", keys.scheduled_keys, (), client)

    def enqueue(self, keys: QueueKeys, entries: Sequence[tuple[str, bytes]], client: Any = None) -> Any:
        """Push ``(redis_message_id, data)`` pairs; returns the queue length, or the pipeline."""
        args: list[Any] = []
        for entry in entries:
            args.extend(entry)
        return self._run("enqueue", (keys.ready, keys.ready_msgs, keys.channel), args, client)

    def fetch(self, keys: QueueKeys, worker_id: str, count: int) -> list[tuple[str, bytes | None]]:
        flat = self._run(
            "fetch", (keys.ready, keys.ready_msgs, keys.acks(worker_id), keys.heartbeats), (count, worker_id)
        )
        return [(flat[i].decode(), flat[i + 1]) for i in range(0, len(flat), 2)]

    def ack(self, keys: QueueKeys, worker_id: str, redis_message_id: str) -> int:
        return int(
            self._run_idempotent(
                "ack", (keys.acks(worker_id), keys.ready_msgs, keys.heartbeats), (redis_message_id, worker_id)
            )
        )

    def nack(self, keys: QueueKeys, worker_id: str, redis_message_id: str) -> int:
        return int(
            self._run_idempotent(
                "nack",
                (keys.acks(worker_id), keys.ready_msgs, keys.xq, keys.xq_msgs, keys.heartbeats),
                (redis_message_id, worker_id),
            )
        )

    def requeue(self, keys: QueueKeys, worker_id: str, redis_message_ids: Sequence[str]) -> int:
        return int(
            self._run_idempotent("requeue", (keys.acks(worker_id), keys.ready_msgs, keys.ready), redis_message_ids)
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

    def heartbeat(self, keys: QueueKeys, worker_id: str) -> int:
        """Mark ``worker_id`` alive (runs on a full server too); returns the server time, epoch ms."""
        return int(self._run_idempotent("heartbeat", (keys.heartbeats,), (worker_id,)))
