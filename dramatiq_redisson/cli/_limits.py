"""``limits``: a queue's concurrency and rate limits, fleet-wide and live (see
:attr:`RedissonBroker.limits` and docs/flow-control.md), with the verbs of the API: ``get``
them with what is in use now (``show`` is an alias; without a queue, every known queue's),
``set`` them (exactly these), ``update`` some and keep the others, ``clear`` them, and the
group ``weights``."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import cast

from ..flow._queue_limits import LIMIT_NAMES, QueueLimits
from ._base import EXIT_OK, Command, Context, UsageError, positive_int


def _limit(value: int | None) -> str:
    return "none" if value is None else str(value)


#: What ``limits update`` takes to remove one limit (``--concurrency none``).
NONE = "none"


def _line(verb: str, name: str, limits: QueueLimits) -> str:
    """One line of a queue's limits and what is in use now."""
    line = (
        f"{verb}{name!r}: concurrency {_limit(limits['concurrency'])}, "
        f"per group {_limit(limits['group_concurrency'])}; "
    )
    window = limits["per_ms"]
    if window is not None:
        line += f"rate {_limit(limits['rate'])}, per group {_limit(limits['group_rate'])}, per {window:,} ms; "
    line += (
        f"{limits['in_use']} running, in {limits['groups_in_use']} groups; "
        f"{limits['lanes_blocked']} groups waiting for a slot"
    )
    if window is not None:
        started = limits["started_in_window"]
        if started is not None:
            line += f", {started} started in the window"
        line += f", {limits['lanes_deferred']} groups waiting for their rate"
    return line


def _old(before: QueueLimits, after: QueueLimits) -> dict[str, int]:
    """The limits ``before`` had that ``after`` dropped or changed, with their old values."""
    old, new = cast("dict[str, int | None]", before), cast("dict[str, int | None]", after)
    return {field: value for field in LIMIT_NAMES if (value := old[field]) is not None and value != new[field]}


def _report(ctx: Context, verb: str, limits: QueueLimits, before: QueueLimits | None = None, what: str = "") -> int:
    """Print a queue's limits (``verb`` before its name); with ``before``, also the limits
    dropped or changed, as a second line starting with ``what`` (JSON: ``replaced``, each
    old value)."""
    name = ctx.args.queue
    old = _old(before, limits) if before is not None else {}
    if ctx.json_mode:
        ctx.out.json({"queue": name, **limits, **({"replaced": old} if before is not None else {})})
        return EXIT_OK
    ctx.out.line(_line(verb, name, limits))
    if old:
        now = cast("dict[str, int | None]", limits)
        ctx.out.line(
            f"{what} " + ", ".join(f"{field} {value} (now {_limit(now[field])})" for field, value in old.items())
        )
    return EXIT_OK


def cmd_limits_get(ctx: Context) -> int:
    """One queue's limits, or (no queue) every known queue's."""
    if ctx.args.queue is not None:
        return _report(ctx, "", ctx.broker.limits.get(ctx.args.queue))
    every = {name: ctx.broker.limits.get(name) for name in ctx.broker.known_queues()}
    if ctx.json_mode:
        ctx.out.json({"queues": [{"queue": name, **limits} for name, limits in every.items()]})
        return EXIT_OK
    if not every:
        ctx.out.line("No known queues: a queue is known once declared, sent to or consumed.")
    for name, limits in every.items():
        ctx.out.line(_line("", name, limits))
    return EXIT_OK


def _given(args: argparse.Namespace) -> dict[str, int | str | None]:
    return {field: getattr(args, field) for field in LIMIT_NAMES}


def cmd_limits_set(ctx: Context) -> int:
    given = _given(ctx.args)
    if all(value is None for value in given.values()):
        raise UsageError(
            "limits set: give --concurrency, --group-concurrency, --rate/--group-rate with --per-ms, "
            "or several (no limit: limits clear; to change one limit and keep the others: limits update)"
        )
    before = ctx.broker.limits.get(ctx.args.queue)  # (an unknown queue: ValueError, exit 2)
    ctx.broker.limits.set(ctx.args.queue, **given)  # type: ignore[arg-type]  # (a rate without its window: exit 2)
    return _report(ctx, "set ", ctx.broker.limits.get(ctx.args.queue), before, "replaced")


def cmd_limits_update(ctx: Context) -> int:
    changes = {
        field: None if value == NONE else value for field, value in _given(ctx.args).items() if value is not None
    }
    if not changes:
        raise UsageError(
            "limits update: give the limits to change (--concurrency, --group-concurrency, --rate, --per-ms, "
            f"--group-rate; {NONE!r} removes one); the others are kept"
        )
    before = ctx.broker.limits.get(ctx.args.queue)
    ctx.broker.limits.update(ctx.args.queue, **changes)  # type: ignore[arg-type]
    return _report(ctx, "updated ", ctx.broker.limits.get(ctx.args.queue), before, "changed")


def cmd_limits_clear(ctx: Context) -> int:
    before = ctx.broker.limits.get(ctx.args.queue)
    ctx.broker.limits.clear(ctx.args.queue)
    return _report(ctx, "cleared ", ctx.broker.limits.get(ctx.args.queue), before, "removed")


def _weight(text: str) -> tuple[str, int]:
    """``GROUP=WEIGHT`` (the last ``=`` splits: a group name may hold one)."""
    group, sep, weight = text.rpartition("=")
    if not sep or not group or not weight.isascii() or not weight.isdigit():
        raise argparse.ArgumentTypeError(f"expected GROUP=WEIGHT (a whole number), got {text!r}")
    return group, int(weight)


def cmd_limits_weights(ctx: Context) -> int:
    args = ctx.args
    if args.pairs and args.clear:
        raise UsageError("limits weights: give GROUP=WEIGHT pairs or --clear, not both")
    if args.pairs or args.clear:
        weights = ctx.broker.limits.set_weights(args.queue, dict(args.pairs))
    else:
        weights = ctx.broker.limits.weights(args.queue)
    if ctx.json_mode:
        ctx.out.json({"queue": args.queue, "weights": weights})
    elif weights:
        ctx.out.line(
            f"{args.queue!r}: "
            + ", ".join(f"{group} {weight}" for group, weight in weights.items())
            + "; every other group 1"
        )
    else:
        ctx.out.line(f"{args.queue!r}: every group weighs 1")
    return EXIT_OK


def _weights_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "pairs",
        nargs="*",
        type=_weight,
        metavar="GROUP=WEIGHT",
        help="set exactly these weights (a group not named weighs 1); none: show them",
    )
    parser.add_argument("--clear", action="store_true", help="every group weighs 1 again")


def _limit_or_none(text: str) -> int | str:
    """``limits update``'s values: a whole number from 1, or ``none`` (remove the limit)."""
    return NONE if text.strip().lower() == NONE else positive_int(text)


def _limit_arguments(parser: argparse.ArgumentParser, value: Callable[[str], int | str], remove: str) -> None:
    helps = {
        "concurrency": "at most N of the queue's messages run at once",
        "group-concurrency": "at most N messages of one group_key run at once (1: one at a time, in order)",
        "rate": "at most N of the queue's messages start per window",
        "group-rate": "at most N messages of one group_key start per window",
        "per-ms": "the rate window, in ms (with --rate or --group-rate)",
    }
    for option, text in helps.items():
        metavar = "MS" if option == "per-ms" else "N"
        parser.add_argument(f"--{option}", type=value, metavar=metavar, help=text + remove)


def _set_arguments(parser: argparse.ArgumentParser) -> None:
    _limit_arguments(parser, positive_int, "")


def _update_arguments(parser: argparse.ArgumentParser) -> None:
    _limit_arguments(parser, _limit_or_none, f" ({NONE}: remove it)")


LIMITS_GET = Command(
    "get",
    "a queue's limits and what is in use now; without QUEUE, every known queue's",
    cmd_limits_get,
    aliases=("show",),
    queue_optional=True,
)
LIMITS_SET = Command(
    "set",
    "set a queue's limits, exactly these (a limit not given: none); prints the limits it replaced",
    cmd_limits_set,
    _set_arguments,
)
LIMITS_UPDATE = Command(
    "update",
    "change only the limits given and keep the others (none: remove one)",
    cmd_limits_update,
    _update_arguments,
)
LIMITS_CLEAR = Command("clear", "remove a queue's limits (priorities and groups still apply)", cmd_limits_clear)
LIMITS_WEIGHTS = Command(
    "weights",
    "a queue's group weights: a group of weight w takes up to w messages per turn",
    cmd_limits_weights,
    _weights_arguments,
)

LIMITS = Command(
    "limits",
    "concurrency and rate limits per queue and per group, group weights: get, set, update, clear, weights",
    actions=(LIMITS_GET, LIMITS_SET, LIMITS_UPDATE, LIMITS_CLEAR, LIMITS_WEIGHTS),
    description="Concurrency and rate limits of a queue, fleet-wide and live (the verbs of broker.limits).",
)
