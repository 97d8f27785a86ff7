"""``limits``: a queue's concurrency limits, fleet-wide and live (see
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
    ctx.out.line(
        f"{verb}{name!r}: concurrency {_limit(limits['concurrency'])}, "
        f"per group {_limit(limits['group_concurrency'])}; "
        f"{limits['in_use']} running, in {limits['groups_in_use']} groups; "
        f"{limits['lanes_blocked']} groups waiting for a slot"
    )
    return EXIT_OK


def cmd_limits_show(ctx: Context) -> int:
    return _report(ctx, "", ctx.broker.limits.get(ctx.args.queue))


def cmd_limits_set(ctx: Context) -> int:
    concurrency, group = ctx.args.concurrency, ctx.args.group_concurrency
    if concurrency is None and group is None:
        raise UsageError("limits set: give --concurrency, --group-concurrency or both (no limit: limits clear)")
    ctx.broker.limits.set(ctx.args.queue, concurrency=concurrency, group_concurrency=group)
    return _report(ctx, "set ", ctx.broker.limits.get(ctx.args.queue))


def cmd_limits_clear(ctx: Context) -> int:
    ctx.broker.limits.clear(ctx.args.queue)
    return _report(ctx, "cleared ", ctx.broker.limits.get(ctx.args.queue))


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


LIMITS_SHOW = Command("show", "a queue's limits and what is in use now", cmd_limits_show)
LIMITS_SET = Command(
    "set", "set a queue's limits, exactly these (a limit not given: none)", cmd_limits_set, _set_arguments
)
LIMITS_CLEAR = Command("clear", "remove a queue's limits (priorities and groups still apply)", cmd_limits_clear)

LIMITS = Command(
    "limits",
    "concurrency limits per queue and per group: show, set, clear",
    actions=(LIMITS_SHOW, LIMITS_SET, LIMITS_CLEAR),
    description="Concurrency limits of a queue, fleet-wide and live.",
)
