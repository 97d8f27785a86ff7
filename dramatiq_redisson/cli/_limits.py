"""``limits``: a queue's concurrency and rate limits, fleet-wide and live (see
:attr:`RedissonBroker.limits` and docs/flow-control.md): ``show`` them with what is in use
now, ``set`` them, ``clear`` them."""

from __future__ import annotations

import argparse

from .._queue_limits import QueueLimits
from ._base import EXIT_OK, Command, Context, UsageError, positive_int


def _limit(value: int | None) -> str:
    return "none" if value is None else str(value)


def _report(ctx: Context, verb: str, limits: QueueLimits) -> int:
    name = ctx.args.queue
    if ctx.json_mode:
        ctx.out.json({"queue": name, **limits})
        return EXIT_OK
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
    ctx.out.line(line)
    return EXIT_OK


def cmd_limits_show(ctx: Context) -> int:
    return _report(ctx, "", ctx.broker.limits.get(ctx.args.queue))


def cmd_limits_set(ctx: Context) -> int:
    args = ctx.args
    given = {
        "concurrency": args.concurrency,
        "group_concurrency": args.group_concurrency,
        "rate": args.rate,
        "per_ms": args.per_ms,
        "group_rate": args.group_rate,
    }
    if all(value is None for value in given.values()):
        raise UsageError(
            "limits set: give --concurrency, --group-concurrency, --rate/--group-rate with --per-ms, "
            "or several (no limit: limits clear)"
        )
    ctx.broker.limits.set(args.queue, **given)  # (a rate without its window: ValueError, exit 2)
    return _report(ctx, "set ", ctx.broker.limits.get(ctx.args.queue))


def cmd_limits_clear(ctx: Context) -> int:
    ctx.broker.limits.clear(ctx.args.queue)
    return _report(ctx, "cleared ", ctx.broker.limits.get(ctx.args.queue))


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


def _set_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--concurrency", type=positive_int, metavar="N", help="at most N of the queue's messages run at once"
    )
    parser.add_argument(
        "--group-concurrency",
        type=positive_int,
        metavar="N",
        help="at most N messages of one group_key run at once (1: one at a time, in order)",
    )
    parser.add_argument(
        "--rate", type=positive_int, metavar="N", help="at most N of the queue's messages start per window"
    )
    parser.add_argument(
        "--group-rate", type=positive_int, metavar="N", help="at most N messages of one group_key start per window"
    )
    parser.add_argument(
        "--per-ms", type=positive_int, metavar="MS", help="the rate window, in ms (with --rate or --group-rate)"
    )


LIMITS_SHOW = Command("show", "a queue's limits and what is in use now", cmd_limits_show)
LIMITS_SET = Command(
    "set", "set a queue's limits, exactly these (a limit not given: none)", cmd_limits_set, _set_arguments
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
    "concurrency and rate limits per queue and per group, group weights: show, set, clear, weights",
    actions=(LIMITS_SHOW, LIMITS_SET, LIMITS_CLEAR, LIMITS_WEIGHTS),
    description="Concurrency and rate limits of a queue, fleet-wide and live.",
)
