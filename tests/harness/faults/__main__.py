"""``python -m tests.harness.faults [SCENARIO ...|all] [--size small|full] [--broker redisson,builtin] [--json]
[--product DIR]``

Prints a Markdown table (or JSON) with one row per scenario; exits 1 when any scenario
fails its criteria (see ``scenarios.Criteria``), 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path
from types import FrameType

from .periodic import PeriodicScenario
from .procs import DEFAULT_PRODUCT_ROOT
from .runner import BROKERS, SCENARIOS, SIZES, as_json, from_json, markdown, run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.harness.faults", description=__doc__)
    parser.add_argument("scenarios", nargs="*", default=["all"], help=f"all, or any of: {', '.join(SCENARIOS)}")
    parser.add_argument("--size", choices=sorted(SIZES), default="full")
    parser.add_argument("--json", action="store_true", help="print JSON instead of Markdown")
    parser.add_argument(
        "--product",
        type=Path,
        default=DEFAULT_PRODUCT_ROOT,
        help="tree whose dramatiq_redisson the workers and producer import (default: this repository)",
    )
    parser.add_argument(
        "--broker",
        default="redisson",
        help="comma-separated: redisson, builtin (Dramatiq's RedisBroker, where the scenario applies); "
        "default redisson",
    )
    parser.add_argument(
        "--flow",
        action="store_true",
        help="flow control on: groups, priorities, a queue and a group concurrency limit; every slot must come back",
    )
    parser.add_argument("--json-out", type=Path, help="also write the JSON results to this file")
    parser.add_argument("--keep", action="store_true", help="keep every scenario's temp dir (logs, AOF)")
    parser.add_argument("--render", type=Path, help="run nothing: print the table of a saved --json-out file")
    args = parser.parse_args(argv)
    if args.render:
        saved = from_json(args.render.read_text())
        print(markdown(saved))
        return 0 if all(r.passed for r in saved) else 1
    names = list(SCENARIOS) if args.scenarios in (["all"], []) else args.scenarios
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        parser.error(f"unknown scenario(s) {unknown}; known: {list(SCENARIOS)}")
    brokers = tuple(b.strip() for b in args.broker.split(",") if b.strip())
    if not brokers or set(brokers) - set(BROKERS):
        parser.error(f"--broker: any of {', '.join(BROKERS)}, got {args.broker!r}")
    if not (args.product / "dramatiq_redisson" / "__init__.py").exists():
        parser.error(f"{args.product} has no dramatiq_redisson package")
    signal.signal(signal.SIGTERM, _interrupt)  # stop every server and worker on SIGTERM too
    if args.flow and any(isinstance(SCENARIOS[n], PeriodicScenario) for n in names):
        parser.error("--flow: not with the periodic scenarios")
    results = run(names, SIZES[args.size], args.product.resolve(), keep=args.keep, brokers=brokers, flow=args.flow)
    if args.json_out:
        args.json_out.write_text(as_json(results))
    print(as_json(results) if args.json else markdown(results))
    return 0 if all(r.passed for r in results) else 1


def _interrupt(signum: int, frame: FrameType | None) -> None:
    """SIGTERM unwinds like Ctrl-C, through the ``finally`` blocks that stop by pid every
    process the suite started (a background job ignores SIGINT)."""
    raise KeyboardInterrupt(f"signal {signum}")


if __name__ == "__main__":
    sys.exit(main())
