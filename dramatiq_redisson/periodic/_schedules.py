"""Periodic actors: cron and fixed intervals on the delayed queue, exactly once per tick,
with no scheduler process.

A schedule is a chain of delayed messages on its actor's queue. Exactly one tick of it is
scheduled at any time (its member in ``redisson_delay_queue_chains:{N}``), and the
transfer script that moves a tick to the ready queue schedules the next tick in the same
atomic step (``lua/transfer.lua``, "Periodic ticks"). So however many worker processes
and hosts consume the queue, each tick moves once, at its time on the server's clock, as
every delayed message does; no process is special, and none has to be running at a tick
for the schedule to go on (the next worker that starts moves what is due).

The next tick times are computed here (cron needs a time zone database: see
:mod:`dramatiq_redisson.periodic._spec`), :data:`dramatiq_redisson._tuning.PERIODIC_HORIZON` ahead, and stored with the
chain; the transfer reports a chain running low, and the consumer tops it up.

A tick that moves late (more than :data:`dramatiq_redisson._tuning.PERIODIC_GRACE_MS` after its time, or
after the following tick's time too: every worker was down) is not run by the transfer:
the chain stops there, and the consumer resumes it by the schedule's ``catch_up``
policy: ``"one"`` runs the latest missed tick once, ``"all"`` every missed tick,
``"none"`` none; then the schedule goes on at its next tick. Each change of a chain is a
guarded script call (``lua/schedule.lua``): two workers resuming or reconciling the same
schedule at once make one change, never two chains.

A tick's message has the id ``periodic:<name>:<tick ms>``, its time as
``message_timestamp``, and the option ``periodic`` (the schedule's name). Once on the
ready queue it is an ordinary message: Dramatiq's ``Retries`` retry a failing tick (the
schedule goes on meanwhile), and a worker killed while running a tick has it redelivered
(at least once, as any message).
"""

from __future__ import annotations

import builtins
import json
import re
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, cast

from dramatiq import get_encoder
from dramatiq.actor import Actor
from dramatiq.broker import Broker, MessageProxy
from dramatiq.message import Message
from dramatiq.middleware import Middleware, SkipMessage

from .._ids import sort_key_at
from .._keys import QueueKeys, registry_key
from .._logs import logger_for
from .._message import RS, encode_message, encode_scheduled, with_redis_id
from .._times import iso
from .._tuning import PERIODIC_HORIZON, PERIODIC_LOW_WATER
from ._spec import (
    CATCH_UP_POLICIES,
    InvalidSchedule,
    Policy,
    ScheduleSpec,
    catch_up_ticks,
    jitter_offset,
    parse_policy,
    parse_spec,
    times_text,
)

if TYPE_CHECKING:
    from ..connection._commands import Commands
    from ..scripts._calls import Scripts

__all__ = [
    "InvalidSchedule",
    "PeriodicStartDeadline",
    "Schedule",
    "ScheduleInfo",
    "Schedules",
    "declared_schedules",
    "periodic",
]

#: A schedule's name: it is part of its ticks' message ids and of the keys' field names.
_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,200}$")

_A = TypeVar("_A", bound=Actor[Any, Any])


@dataclass(frozen=True)
class Schedule:
    """A periodic actor's schedule as declared in code (see :func:`periodic`)."""

    name: str
    actor_name: str
    queue_name: str
    spec: ScheduleSpec
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    catch_up: str = "one"
    policy: Policy = field(default_factory=Policy)

    def definition(self) -> dict[str, Any]:
        """What is stored and compared on reconcile (without anchor and version); the
        policy's fields only where they differ from the defaults, so a schedule without
        them keeps the definition an earlier version stored."""
        return {
            "actor": self.actor_name,
            "args": list(self.args),
            "catch_up": self.catch_up,
            "kwargs": self.kwargs,
            "spec": json.loads(self.spec.to_json()),
            **self.policy.stored(),
        }


#: Every schedule declared in this process, by name (see :func:`periodic`).
_DECLARED: dict[str, tuple[Schedule, Actor[Any, Any]]] = {}


def declared_schedules() -> dict[str, Schedule]:
    """The schedules declared in this process, by name."""
    return {name: schedule for name, (schedule, _) in _DECLARED.items()}


def periodic(
    *,
    cron: str | None = None,
    every: str | timedelta | None = None,
    tz: str | None = None,
    args: Iterable[Any] = (),
    kwargs: dict[str, Any] | None = None,
    name: str | None = None,
    catch_up: str = "one",
    overlap: str = "allow",
    jitter: str | timedelta | None = None,
    start_deadline: str | timedelta | None = None,
    start: datetime | None = None,
    end: datetime | None = None,
    limit: int | None = None,
) -> Callable[[_A], _A]:
    """Run an actor on a schedule: ``cron`` (5 fields, in time zone ``tz``, default UTC) or
    ``every`` (a :class:`~datetime.timedelta`, or a duration with its unit: ``"30s"``,
    ``"5m"``, ``"1h30m"``, ``"250ms"``; a bare number is refused, its unit would be a
    guess), with ``args``/``kwargs``. Put it above ``@dramatiq.actor``::

        @periodic(cron="*/5 * * * *", tz="Europe/Berlin")
        @dramatiq.actor
        def cleanup(): ...

        @periodic(every="30s")  # or every=timedelta(seconds=30)
        @dramatiq.actor
        def poll(): ...

    ``name`` (default: the actor's name) identifies the schedule; ``catch_up`` says what
    runs when every worker was down over ticks: ``"one"`` (the latest missed tick, once),
    ``"all"`` (each) or ``"none"``.

    Under load (each default keeps the behaviour above):

    - ``overlap="skip"``: a tick is skipped (and counted) while the schedule's previous
      run is still scheduled (a retry), queued or running anywhere; ``"allow"`` runs it.
    - ``jitter``: each tick is due up to this much after its time, by an offset derived
      from the schedule's name and the tick's time (the same on every worker); its
      message id and ``message_timestamp`` stay the tick's time.
    - ``start_deadline``: a tick that has not started this long after it was due is
      dropped (and counted), a missed tick run by ``catch_up`` as well.
    - ``start``, ``end`` (aware datetimes): no tick before ``start`` nor after ``end``;
      with ``every``, ticks fall at ``start + k × every``.
    - ``limit``: the schedule ends after this many runs (ticks enqueued).

    Durations take a :class:`~datetime.timedelta` or a text with its unit, as ``every``.
    Workers that consume the actor's queue store the schedule when they start (a changed
    definition takes effect from its next tick); nothing else needs to run. Raises
    :class:`InvalidSchedule` naming every bad value (and writes nothing)."""
    errors: list[str] = []
    spec: ScheduleSpec | None = None
    try:
        spec = parse_spec(cron=cron, every=every, tz=tz)
    except InvalidSchedule as e:
        errors.append(str(e))
    if catch_up not in CATCH_UP_POLICIES:
        errors.append(f"catch_up: expected one of {', '.join(CATCH_UP_POLICIES)}, got {catch_up!r}")
    policy, wrong = parse_policy(
        spec, overlap=overlap, jitter=jitter, start_deadline=start_deadline, start=start, end=end, limit=limit
    )
    errors += wrong
    arguments = tuple(args)
    keywords = dict(kwargs or {})
    try:
        json.dumps([arguments, keywords])
    except (TypeError, ValueError) as e:
        errors.append(f"args/kwargs: must be JSON-serialisable: {e}")
    if errors:
        if len(errors) == 1:
            raise InvalidSchedule(errors[0])
        raise InvalidSchedule(f"{len(errors)} bad values: " + "; ".join(errors))
    assert spec is not None and policy is not None

    def declare(actor: _A) -> _A:
        if not isinstance(actor, Actor):
            raise InvalidSchedule("periodic: decorate an actor (put @periodic above @dramatiq.actor)")
        schedule_name = name or actor.actor_name
        if not _NAME.match(schedule_name):
            raise InvalidSchedule(f"name: letters, digits, '_', '.' and '-' only (at most 200), got {schedule_name!r}")
        known = _DECLARED.get(schedule_name)
        if known is not None and known[0].actor_name != actor.actor_name:
            raise InvalidSchedule(f"name: schedule {schedule_name!r} is already declared for {known[0].actor_name!r}")
        schedule = Schedule(
            schedule_name, actor.actor_name, actor.queue_name, spec, arguments, keywords, catch_up, policy
        )
        _DECLARED[schedule_name] = (schedule, actor)
        if policy.start_deadline_ms is not None:
            PeriodicStartDeadline.install(actor.broker)
        return actor

    return declare


@dataclass(frozen=True)
class ScheduleInfo:
    """One stored schedule, as :meth:`Schedules.list` shows it. Times are epoch ms on the
    server's clock."""

    name: str
    queue_name: str
    actor_name: str
    spec: str  #: e.g. ``cron */5 * * * * (Europe/Berlin)``, ``every 30s``
    cron: str | None
    every_ms: int | None
    tz: str
    catch_up: str
    args: list[Any]
    kwargs: dict[str, Any]
    next_due_ms: int | None  #: when its chained tick is due (None: paused or waiting)
    last_run_ms: int | None  #: the time of the last tick that ran
    last_lateness_ms: int | None  #: how late that tick moved to the ready queue
    paused: bool
    waiting_since_ms: int | None  #: the chain stopped at this tick and waits to be resumed
    declared: bool  #: declared in this process (``@periodic``)
    version: int
    overlap: str = "allow"  #: ``"allow"`` or ``"skip"``
    jitter_ms: int | None = None
    start_deadline_ms: int | None = None
    start_ms: int | None = None  #: no tick before (the window's start)
    end_ms: int | None = None  #: no tick after (the window's end)
    limit: int | None = None  #: the schedule ends after this many runs
    runs: int = 0  #: ticks enqueued (counted since this version stored the schedule)
    runs_left: int | None = None  #: with a limit
    skipped: int = 0  #: ticks skipped while the previous run was not done (overlap="skip")
    dropped: int = 0  #: ticks dropped, not started by their start deadline
    ended: str | None = None  #: ``"end"`` (its window is over) or ``"limit"``: no more ticks

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    def policy_text(self) -> str:
        """The policies that differ from the defaults, short: ``overlap=skip jitter=30s``."""
        parts = []
        if self.overlap != "allow":
            parts.append(f"overlap={self.overlap}")
        if self.jitter_ms:
            parts.append(f"jitter={_ms_text(self.jitter_ms)}")
        if self.start_deadline_ms:
            parts.append(f"start_deadline={_ms_text(self.start_deadline_ms)}")
        if self.limit is not None:
            parts.append(f"limit={self.limit}")
        return " ".join(parts) or "-"

    def ending(self) -> str:
        """Whether and when it ends, short: ``ended (window over)``, ``ended (limit: 3
        runs)``, ``window ends 2030-01-01T00:00:00+00:00, 2 runs left``; "" if never."""
        if self.ended == "end":
            return "ended (window over)"
        if self.ended:
            return f"ended (limit: {self.limit} runs)"
        parts = []
        if self.end_ms is not None:
            parts.append(f"window ends {_iso(self.end_ms)}")
        if self.runs_left is not None:
            parts.append(f"{self.runs_left} run{'' if self.runs_left == 1 else 's'} left")
        return ", ".join(parts)


class PeriodicHost(Protocol):
    """What the periodic actors' schedules read of their broker."""

    actors: dict[str, Actor[..., Any]]
    client: Commands
    namespace: str
    redisson_scripts: Scripts

    def keys(self, queue_name: str) -> QueueKeys: ...

    def enqueue(self, message: Message[Any], *, delay: int | None = None) -> Message[Any]: ...


class Schedules:
    """The periodic actors' schedules stored on the server: ``broker.schedules``.

    Workers keep them by themselves (:meth:`reconcile` at start, :meth:`attend` when a
    transfer reports a chain that stopped or runs low); an operator uses :meth:`list`,
    :meth:`get`, :meth:`pause`, :meth:`resume`, :meth:`run_now` and :meth:`remove`."""

    def __init__(self, broker: PeriodicHost) -> None:
        self.broker = broker
        self.logger = logger_for(type(self))
        self._reported: set[tuple[str, str]] = set()

    # -- what is declared ------------------------------------------------------------

    def declared(self, queue_name: str | None = None) -> dict[str, Schedule]:
        """Schedules declared in this process whose actor is declared on this broker
        (on ``queue_name`` when given)."""
        found = {}
        for name, (schedule, actor) in _DECLARED.items():
            if self.broker.actors.get(schedule.actor_name) is not actor:
                continue
            if queue_name is None or schedule.queue_name == queue_name:
                found[name] = schedule
        return found

    # -- helpers -------------------------------------------------------------------

    def _now_ms(self) -> int:
        seconds, micros = self.broker.client.time()
        return int(seconds) * 1000 + int(micros) // 1000

    def _keys(self, queue_name: str) -> QueueKeys:
        return self.broker.keys(queue_name)

    def _tick_message(self, name: str, stored: dict[str, Any], queue_name: str, tick_ms: int) -> Message[Any]:
        return Message(
            queue_name=queue_name,
            actor_name=stored["actor"],
            args=tuple(stored.get("args", ())),
            kwargs=dict(stored.get("kwargs", {})),
            options={"periodic": name, **Policy.from_stored(stored).tick_options()},
            message_id=f"periodic:{name}:{tick_ms}",
            message_timestamp=tick_ms,
        )

    def _chain_entry(self, name: str, stored: dict[str, Any], queue_name: str, tick_ms: int) -> tuple[str, bytes]:
        """The member and stored payload of the chained tick at ``tick_ms``: the payload
        must be compact (transfer.lua rewrites its timestamp for the next tick)."""
        sort_key = sort_key_at(tick_ms)
        message = self._tick_message(name, stored, queue_name, tick_ms)
        member = sort_key + message.message_id
        data = encode_scheduled(with_redis_id(message, member), sort_key)
        if not data.startswith(RS) or data.startswith(RS + RS):
            raise InvalidSchedule(
                "periodic actors need Dramatiq's JSON encoder and JSON arguments "
                f"(schedule {name!r} could not be stored compactly with {type(get_encoder()).__name__})"
            )
        return member, sort_key.encode() + data

    def _run_pairs(self, name: str, stored: dict[str, Any], queue_name: str, ticks: list[int]) -> list[Any]:
        pairs: list[Any] = []
        for tick in ticks:
            message = self._tick_message(name, stored, queue_name, tick)
            redis_id = sort_key_at(tick) + message.message_id
            pairs += [redis_id, encode_message(with_redis_id(message, redis_id))]
        return pairs

    @staticmethod
    def _spec(stored: dict[str, Any]) -> ScheduleSpec:
        return ScheduleSpec.from_json(json.dumps(stored["spec"]))

    def _start(
        self,
        keys: QueueKeys,
        name: str,
        stored: dict[str, Any],
        guard: tuple[str, str],
        now_ms: int,
        *,
        write_definition: bool,
        last_due_ms: int | None = None,
        paused: bool = False,
    ) -> bool:
        """(Re)start ``name``'s chain at its next tick after ``now_ms`` (after the ticks
        the catch-up policy runs now, when it resumes from ``last_due_ms``), if ``guard``
        holds. ``paused``: store the definition only. The window, jitter and start deadline
        apply: no tick outside the window (past its end the schedule ends), the first tick
        due at its time plus its jitter, missed ticks past their deadline dropped."""
        spec = self._spec(stored)
        policy = Policy.from_stored(stored)
        anchor = int(stored["anchor"])
        run: list[int] = []
        # The window's start: no tick before it (start - 1: a tick at start is in it).
        since = now_ms if policy.start_ms is None else max(now_ms, policy.start_ms - 1)
        if last_due_ms is not None:
            run, first = catch_up_ticks(spec, last_due_ms, since, anchor, stored.get("catch_up", "one"))
            run = [t for t in run if policy.in_window(t)]
        else:
            first = spec.next_after(since, anchor)
        deadline = policy.start_deadline_ms
        dropped = [t for t in run if deadline is not None and now_ms > t + policy.offset(name, t) + deadline]
        run = [t for t in run if t not in dropped]
        ended = "" if policy.in_window(first) else "end"
        definition = json.dumps(stored, separators=(",", ":"), sort_keys=True) if write_definition else ""
        if paused or ended:
            member, payload, due, upcoming = "", b"", first, ""
        else:
            member, payload = self._chain_entry(name, stored, keys.queue_name, first)
            due = first + policy.offset(name, first)
            upcoming = times_text(name, policy, self._following(spec, policy, first, anchor, PERIODIC_HORIZON))
        pairs = self._run_pairs(name, stored, keys.queue_name, run)
        done = self.broker.redisson_scripts.schedule(
            keys,
            "start",
            name,
            *guard,
            definition,
            member,
            payload,
            due,
            upcoming,
            policy.overlap if policy.overlap != "allow" else "",
            "" if policy.limit is None else policy.limit,
            ended,
            len(dropped),
            *pairs,
        )
        if done and run:
            self.logger.info(
                "Schedule %r resumed: %d missed tick(s) to run (catch_up=%r); next tick at %d.",
                name,
                len(run),
                stored.get("catch_up"),
                first,
            )
        if done and dropped:
            self.logger.info(
                "Schedule %r dropped %d missed tick(s): not started within their start deadline (%d ms).",
                name,
                len(dropped),
                deadline,
            )
        if done == 2:
            self._ended(name, policy, "end" if ended else "limit")
        return bool(done)

    def _ended(self, name: str, policy: Policy, why: str) -> None:
        """Say once (the worker whose script call ended it) that ``name`` has ended."""
        if why == "limit":
            self.logger.info("Schedule %r has ended: it ran its limit of %s run(s).", name, policy.limit)
        else:
            self.logger.info("Schedule %r has ended: its window ended at %s.", name, _iso(policy.end_ms))

    @staticmethod
    def _following(spec: ScheduleSpec, policy: Policy, after_ms: int, anchor: int, count: int) -> list[int]:
        """Up to ``count`` ticks after ``after_ms``, none past the window's end."""
        ticks, at = [], after_ms
        for _ in range(count):
            at = spec.next_after(at, anchor)
            if policy.end_ms is not None and at > policy.end_ms:
                break
            ticks.append(at)
        return ticks

    # -- workers: reconcile and attend ---------------------------------------------

    def reconcile(self, queue_name: str) -> list[str]:
        """Store the schedules declared for ``queue_name`` (new ones start at their next
        tick; a changed one takes effect from its next tick, in place of the old chain),
        resume or top up chains that need it, and report stored schedules this process
        does not declare (they are kept: during a rolling deploy old and new code run side
        by side; :meth:`remove` drops one). Returns the names of the changed schedules."""
        keys = self._keys(queue_name)
        declared = self.declared(queue_name)
        client = self.broker.client
        stored_raw = _hash(client.hgetall(keys.schedules))
        if declared:
            client.sadd(registry_key(self.broker.namespace), queue_name)
        changed = []
        for name, schedule in declared.items():
            with self._each(name):
                if self._reconcile_one(keys, name, schedule, stored_raw.get(name)):
                    changed.append(name)
        if stored_raw:
            self.attend_all(queue_name)
        for name in sorted(set(stored_raw) - set(declared)):
            if (queue_name, name) not in self._reported:
                self._reported.add((queue_name, name))
                self.logger.warning(
                    "Schedule %r on queue %r is stored but not declared in this process; it keeps "
                    "running. Remove it with `dramatiq-redisson schedules remove %s` if it is gone for good.",
                    name,
                    queue_name,
                    name,
                )
        return changed

    @contextmanager
    def _each(self, name: str) -> Iterator[None]:
        """One schedule's bad data (a malformed definition, a spec this version cannot
        read) is logged and skipped: the others, and the consumer, go on."""
        try:
            yield
        except (InvalidSchedule, ValueError, KeyError, TypeError) as e:
            self.logger.error("Schedule %r skipped: %s", name, e)

    def _reconcile_one(self, keys: QueueKeys, name: str, schedule: Schedule, raw: str | None) -> bool:
        client = self.broker.client
        wanted = schedule.definition()
        current = _load(raw)
        if current is not None and {k: current.get(k) for k in wanted} == wanted:
            return False  # unchanged (reconcile's sweep resumes or tops it up if needed)
        now_ms = self._now_ms()
        spec_changed = current is None or current.get("spec") != wanted["spec"]
        anchor = now_ms if spec_changed else int(current["anchor"])  # type: ignore[index]
        if schedule.spec.every_ms is not None and schedule.policy.start_ms is not None:
            anchor = schedule.policy.start_ms  # ticks at start + k × every
        stored = {
            **wanted,
            "anchor": anchor,
            "version": 1 if current is None else int(current.get("version", 0)) + 1,
        }
        paused = bool(client.hget(keys.schedule_state, f"{name}|p"))
        guard = ("def", raw if raw is not None else "")
        if not self._start(keys, name, stored, guard, now_ms, write_definition=True, paused=paused):
            return False  # another worker changed it first
        self.logger.info(
            "Schedule %r %s: %s on actor %r, queue %r.",
            name,
            "stored" if current is None else "updated",
            schedule.spec.describe(),
            schedule.actor_name,
            keys.queue_name,
        )
        return True

    def attend(self, keys: QueueKeys, names: Iterable[str]) -> None:
        """Resume the chains of ``names`` that stopped (by their catch-up policy) and top
        up those running low on upcoming ticks."""
        for name in names:
            with self._each(name):
                self._attend_one(keys, name)

    def _attend_one(self, keys: QueueKeys, name: str) -> None:
        scripts = self.broker.redisson_scripts
        now_ms = self._now_ms()
        raw, waiting, paused, upcoming, chained, ended = (
            _str(v) if v else "" for v in scripts.schedule(keys, "check", name, now_ms)
        )
        stored = _load(raw)
        if ended == "limit" and stored is not None:
            # Named by the transfer whose run reached the limit: said once, here.
            self._ended(name, Policy.from_stored(stored), ended)
            return
        if stored is None or paused or ended:
            return
        if waiting:
            self._start(
                keys,
                name,
                stored,
                ("stall", waiting),
                now_ms,
                write_definition=False,
                last_due_ms=int(waiting),
            )
            return
        raw_times = [t for t in upcoming.split(",") if t]
        if chained and len(raw_times) < PERIODIC_LOW_WATER * 2:
            spec, policy = self._spec(stored), Policy.from_stored(stored)
            after = int(raw_times[-1].partition("+")[0]) if raw_times else _member_tick(chained)
            more = self._following(spec, policy, after, int(stored["anchor"]), PERIODIC_HORIZON - len(raw_times))
            if more:
                last = raw_times[-1] if raw_times else ""
                scripts.schedule(keys, "extend", name, last, times_text(name, policy, more))

    def attend_all(self, queue_name: str) -> None:
        """:meth:`attend` to the queue's schedules that need it (a consumer's maintenance:
        a chain whose reporter died, or whose tick an operator cancelled), found by one
        script call however many schedules the queue has."""
        keys = self._keys(queue_name)
        names = self.broker.redisson_scripts.schedule(keys, "sweep", "", self._now_ms(), PERIODIC_LOW_WATER)
        if names:
            self.attend(keys, [_str(name) for name in names])

    # -- operators ------------------------------------------------------------------

    def _queues(self) -> list[str]:
        names = {_str(m) for m in self.broker.client.smembers(registry_key(self.broker.namespace))}
        names.update(schedule.queue_name for schedule in self.declared().values())
        return sorted(names)

    def list(self) -> builtins.list[ScheduleInfo]:
        """Every stored schedule of the broker's namespace, by queue and name."""
        found: builtins.list[ScheduleInfo] = []
        for queue_name in self._queues():
            found += self._list_queue(queue_name)
        return found

    def _list_queue(self, queue_name: str) -> builtins.list[ScheduleInfo]:
        keys = self._keys(queue_name)
        client = self.broker.client
        raw = _hash(client.hgetall(keys.schedules))
        if not raw:
            return []
        chains = _hash(client.hgetall(keys.chains))
        state = _hash(client.hgetall(keys.schedule_state))
        declared = self.declared()
        members = {name: member for name, member in chains.items() if name in raw}
        pipe = client.pipeline(transaction=False)
        for member in members.values():
            pipe.zscore(keys.timeout_zset, member)
        dues = dict(zip(members, pipe.execute(), strict=True))
        infos = []
        for name, value in sorted(raw.items()):
            stored = _load(value)
            try:
                if stored is None:
                    raise InvalidSchedule("not a JSON object")
                spec = ScheduleSpec.from_json(json.dumps(stored.get("spec", {})))
                policy = Policy.from_stored(stored)
            except InvalidSchedule as e:
                # One unreadable entry (another version's, a hand edit) hides only itself.
                self.logger.error("Schedule %r on queue %r is unreadable, left out: %s", name, queue_name, e)
                continue
            due = dues.get(name)
            runs = _int(state.get(f"{name}|n")) or 0
            infos.append(
                ScheduleInfo(
                    name=name,
                    queue_name=queue_name,
                    actor_name=str(stored.get("actor", "")),
                    spec=spec.describe(),
                    cron=spec.cron,
                    every_ms=spec.every_ms,
                    tz=spec.tz,
                    catch_up=str(stored.get("catch_up", "one")),
                    args=list(stored.get("args", [])),
                    kwargs=dict(stored.get("kwargs", {})),
                    next_due_ms=int(due) if due is not None else None,
                    last_run_ms=_int(state.get(f"{name}|r")),
                    last_lateness_ms=_int(state.get(f"{name}|l")),
                    paused=state.get(f"{name}|p") == "1",
                    waiting_since_ms=_int(state.get(f"{name}|s")),
                    declared=name in declared and declared[name].queue_name == queue_name,
                    version=int(stored.get("version", 1)),
                    overlap=policy.overlap,
                    jitter_ms=policy.jitter_ms,
                    start_deadline_ms=policy.start_deadline_ms,
                    start_ms=policy.start_ms,
                    end_ms=policy.end_ms,
                    limit=policy.limit,
                    runs=runs,
                    runs_left=None if policy.limit is None else max(policy.limit - runs, 0),
                    skipped=_int(state.get(f"{name}|k")) or 0,
                    dropped=_int(state.get(f"{name}|d")) or 0,
                    ended=state.get(f"{name}|e") or None,
                )
            )
        return infos

    def get(self, name: str, queue_name: str | None = None) -> ScheduleInfo:
        """One stored schedule (on ``queue_name`` when given: a name may be stored on two
        queues after its actor moved, the old one kept until removed).

        Raises:
          KeyError: There is none by that name.
          ValueError: The name is stored on several queues and ``queue_name`` is not given.
        """
        found = [i for i in self.list() if i.name == name and queue_name in (None, i.queue_name)]
        if not found:
            raise KeyError(f"No schedule named {name!r}" + (f" on queue {queue_name!r}" if queue_name else ""))
        if len(found) > 1:
            queues = ", ".join(repr(i.queue_name) for i in found)
            raise ValueError(f"Schedule {name!r} is stored on several queues ({queues}): name the queue")
        return found[0]

    def pause(self, name: str, queue_name: str | None = None) -> bool:
        """Stop ``name``'s ticks (the scheduled one is unscheduled) until :meth:`resume`;
        the state is on the server, so restarted workers keep it paused. Returns whether
        it was running."""
        info = self.get(name, queue_name)
        return bool(self.broker.redisson_scripts.schedule(self._keys(info.queue_name), "pause", name))

    def resume(self, name: str, queue_name: str | None = None) -> bool:
        """Go on with ``name`` from its next tick after now (ticks while it was paused do
        not run). Returns whether it was paused."""
        info = self.get(name, queue_name)
        keys = self._keys(info.queue_name)
        stored = _load(self.broker.client.hget(keys.schedules, name))
        if stored is None or not info.paused:
            return False
        return self._start(keys, name, stored, ("paused", ""), self._now_ms(), write_definition=False)

    def run_now(self, name: str, queue_name: str | None = None) -> Message[Any]:
        """Run ``name``'s actor now, once, with its arguments, outside the chain (the
        schedule's ticks go on as they were). Returns the message sent."""
        info = self.get(name, queue_name)
        message: Message[Any] = Message(
            queue_name=info.queue_name,
            actor_name=info.actor_name,
            args=tuple(info.args),
            kwargs=dict(info.kwargs),
            options={"periodic": name},
        )
        return self.broker.enqueue(message)

    def remove(self, name: str, queue_name: str | None = None) -> bool:
        """Forget ``name`` and unschedule its tick. A worker that still declares it stores it
        again when it starts. Returns whether it existed."""
        info = self.get(name, queue_name)
        return bool(self.broker.redisson_scripts.schedule(self._keys(info.queue_name), "remove", name))

    def wait_until_stored(self, names: Iterable[str], timeout: float = 10.0) -> None:
        """Block until every schedule of ``names`` is stored (tests, deploy scripts)."""
        deadline = time.monotonic() + timeout
        wanted = set(names)
        while not wanted <= {info.name for info in self.list()}:
            if time.monotonic() > deadline:
                raise TimeoutError(f"schedules not stored within {timeout}s: {sorted(wanted)}")
            time.sleep(0.05)


class PeriodicStartDeadline(Middleware):
    """Drops a periodic tick that has not started by its start deadline (``@periodic(...,
    start_deadline=…)``): added to the actor's broker when such a schedule is declared.

    Before a tick's first attempt runs (a retry of it started already), one script call
    (``lua/schedule.lua``, "begin") compares the server's clock with the tick's due time
    (its time plus its jitter) plus the deadline: past it, the tick is counted as dropped
    and skipped (Dramatiq acks a skipped message); a tick redelivered after it started
    (its worker was killed) runs again."""

    @classmethod
    def install(cls, target: Broker) -> None:
        """Add one to broker ``target`` unless it has one."""
        if not any(isinstance(m, cls) for m in target.middleware):
            target.add_middleware(cls())

    def before_process_message(self, broker: Broker, message: MessageProxy) -> None:
        options = message.options
        deadline, name = options.get("periodic_start_deadline_ms"), options.get("periodic")
        scripts: Scripts | None = getattr(broker, "redisson_scripts", None)
        if not deadline or not isinstance(name, str) or options.get("retries") or scripts is None:
            return
        tick = int(message.message_timestamp)
        latest = tick + jitter_offset(name, tick, int(options.get("periodic_jitter_ms") or 0)) + int(deadline)
        keys = cast("PeriodicHost", broker).keys(message.queue_name)
        if not scripts.schedule(keys, "begin", name, tick, latest):
            logger_for(Schedules).info(
                "Schedule %r: tick %d dropped, not started within its start deadline (%d ms).", name, tick, deadline
            )
            raise SkipMessage(f"periodic tick {message.message_id} missed its start deadline")


def _ms_text(ms: int) -> str:
    if ms % 1000:
        return f"{ms}ms"
    return f"{ms // 1000}s"


def _iso(ms: int | None) -> str:
    return iso(ms, precise=ms is not None and ms % 1000 != 0) or "-"


def _str(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _hash(reply: Any) -> dict[str, str]:
    """An HGETALL reply as text."""
    return {_str(k): _str(v) for k, v in cast("dict[bytes | str, bytes | str]", reply).items()}


def _load(raw: Any) -> dict[str, Any] | None:
    if not raw:
        return None
    try:
        value = json.loads(raw)
    except ValueError:
        logger_for("Schedules").warning("Ignoring a malformed schedule definition: %r", raw)
        return None
    return value if isinstance(value, dict) else None


def _int(text: str | None) -> int | None:
    return int(text) if text not in (None, "") else None


def _member_tick(member: str) -> int:
    """The tick time of a chained member (its message id ends in ``:<tick ms>``)."""
    return int(member.rsplit(":", 1)[1])
