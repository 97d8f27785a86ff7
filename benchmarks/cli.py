"""``python -m benchmarks SCENARIO [--brokers …] [--size …] [--url URL] [--json out.json] [--product DIR]``."""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ._base import BROKER_KINDS, SIZES, dumps, quiet_logging
from ._measure import median_merge
from ._product import machine_info, product_origin, use_product
from ._server import Server
from ._stages import ENV as STAGES_ENV


def _log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def fmt(v: Any) -> str:
    """One table cell."""
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 1000 else f"{v:.0f}"
    return str(v)


def format_table(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "(no rows)"
    cols: list[str] = []
    for row in rows:
        for k in row:
            if k not in cols:
                cols.append(k)
    cells = [[fmt(row.get(c)) for c in cols] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(cols)]
    line = "| " + " | ".join(c.ljust(w) for c, w in zip(cols, widths, strict=False)) + " |"
    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    body = ["| " + " | ".join(v.ljust(w) for v, w in zip(r, widths, strict=False)) + " |" for r in cells]
    return "\n".join([line, sep, *body])


def print_tables(out: dict[str, Any]) -> None:
    """A scenario's rows: one table, or, when it splits them into ``tables`` (title ->
    rows; ``rows`` then holds them all, for the JSON), one table per title."""
    tables = out.get("tables")
    if not tables:
        print(format_table(out["rows"]))
        return
    for i, (title, rows) in enumerate(tables.items()):
        print(("\n" if i else "") + f"### {title}\n")
        print(format_table(rows))


def _strip_samples(obj: Any) -> Any:
    """Drop the bulky raw samples (keys starting with "_") for the printed JSON."""
    if isinstance(obj, dict):
        return {k: _strip_samples(v) for k, v in obj.items() if not str(k).startswith("_")}
    if isinstance(obj, list):
        return [_strip_samples(v) for v in obj]
    return obj


def _merge_targets(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """A target over repeated runs: the median value; met only if met in every run."""
    merged: dict[str, Any] = median_merge(runs)
    verdicts = [t["met"] for t in runs if t["met"] is not None]
    merged["met"] = None if not verdicts else all(verdicts)
    merged["met_runs"] = f"{sum(verdicts)}/{len(verdicts)}" if verdicts else None
    return merged


def _verdict(t: dict[str, Any]) -> str:
    word = {True: "MET", False: "MISSED", None: "-"}[t["met"]]
    if t.get("met_runs") and t["met"] is not None:
        word += f" (met in {t['met_runs']} runs)"
    return word


def sized(size: str, overrides: list[str]) -> dict[str, Any]:
    """The parameters of ``size`` with ``--set scenario.param=value`` overrides applied
    (a JSON value where it parses as one: ``500``, ``[0,100000]``; ``none``: no value,
    e.g. no pace)."""
    import copy
    import json

    params = copy.deepcopy(SIZES[size])
    for item in overrides:
        path, sep, raw = item.partition("=")
        keys = path.split(".")
        if not sep or not all(keys):
            raise SystemExit(f"--set {item!r}: expected scenario.param=value")
        try:
            value: Any = json.loads(raw)  # 500, 0.5, [0, 100000], null
        except ValueError:
            value = None if raw.lower() == "none" else raw
        target = params
        for key in keys[:-1]:
            if not isinstance(target.get(key), dict):
                raise SystemExit(f"--set {item!r}: {key!r} is not a scenario of size {size!r}")
            target = target[key]
        target[keys[-1]] = value
    return params


def main(argv: list[str] | None = None) -> int:
    from .scenarios import NOT_IN_ALL, SCENARIOS, Ctx

    parser = _parser(list(SCENARIOS))
    args = parser.parse_args(argv)
    if args.product is not None:
        try:
            use_product(args.product)
        except (ValueError, RuntimeError) as e:
            parser.error(str(e))

    if args.stages:
        os.environ[STAGES_ENV] = "1"  # inherited by the worker processes (see _stages)
    brokers = [b.strip() for b in args.brokers.split(",") if b.strip()]
    for b in brokers:
        if b not in BROKER_KINDS:
            parser.error(f"unknown broker {b!r}")
    names = [n for n in SCENARIOS if n not in NOT_IN_ALL] if args.scenario == "all" else [args.scenario]
    if args.jobs < 1:
        parser.error("--jobs must be at least 1")
    if args.jobs > 1 and args.url is not None:
        parser.error("--jobs above 1 runs each scenario on its own embedded server: leave --url out")
    quiet_logging()
    failures: list[str] = []
    started = time.monotonic()
    if args.jobs > 1 and len(names) > 1:
        results = _run_apart(names, args)
        for name, merged in results["scenarios"].items():
            failures += merged["failures"]
            _print_scenario(name, merged, args)
    else:
        server = Server(args.url)
        _log(f"server {server.url} ({'embedded' if server.embedded else 'given'}), size {args.size}, brokers {brokers}")
        _log(f"dramatiq_redisson from {product_origin()}")
        machine = machine_info(server, args.product.resolve() if args.product else None)
        results = {"meta": _meta(machine, args, brokers), "scenarios": {}}
        try:
            for name in names:
                merged = _run_scenario(SCENARIOS[name], name, args, server, brokers, Ctx)
                failures += merged["failures"]
                results["scenarios"][name] = merged
                _print_scenario(name, merged, args)
        finally:
            server.stop()
    results["meta"]["seconds"] = round(time.monotonic() - started, 1)
    results["failures"] = failures
    targets = [t for s in results["scenarios"].values() for t in s["targets"]]
    print("\n## summary\n")
    print(format_table([{"target": t["target"], "value": t["value"], "met": _verdict(t)} for t in targets]))
    if args.json_out:
        Path(args.json_out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json_out).write_text(dumps(results))
        _log(f"results written to {args.json_out}")
    print("\n## JSON\n")
    print(
        dumps(
            _strip_samples(
                {
                    "meta": results["meta"],
                    "failures": failures,
                    "scenarios": {
                        k: {"rows": v["rows"], "targets": v["targets"]} for k, v in results["scenarios"].items()
                    },
                }
            )
        )
    )
    if failures:
        print(f"\nFAILED: {len(failures)} problem(s):", file=sys.stderr)
        for f in failures:
            print("  - " + f, file=sys.stderr)
        return 1
    _log(f"done in {results['meta']['seconds']} s, no lost or duplicated messages, no crash")
    return 0


def _meta(machine: dict[str, Any], args: argparse.Namespace, brokers: list[str]) -> dict[str, Any]:
    return {
        **machine,
        "product": product_origin(),
        "size": args.size,
        "brokers": brokers,
        "repeat": args.repeat,
        "command": " ".join(sys.argv),
        "overrides": args.overrides,
        "jobs": args.jobs,
    }


#: Started first by ``--jobs`` (the longest at every size), so that the short ones fill
#: the gaps instead of one long scenario running alone at the end.
LONGEST_FIRST = ("cluster", "fleet", "burst", "head-of-line", "backlog", "periodic", "saturation")


def _run_apart(names: list[str], args: argparse.Namespace) -> dict[str, Any]:
    """``--jobs N``: every scenario in a ``python -m benchmarks SCENARIO`` process of its
    own (its own embedded server and workers), N at a time. Each writes its results as
    JSON; they come back merged in the scenarios' order, with a child that failed to
    report counted as a failure. What a child printed is shown when it failed."""
    import concurrent.futures
    import json
    import subprocess
    import tempfile

    common = ["--brokers", args.brokers, "--size", args.size, "--repeat", str(args.repeat)]
    if args.product is not None:
        common += ["--product", str(args.product)]
    for override in args.overrides:
        common += ["--set", override]
    if args.stages:
        common.append("--stages")
    order = sorted(names, key=lambda n: LONGEST_FIRST.index(n) if n in LONGEST_FIRST else len(LONGEST_FIRST))
    with tempfile.TemporaryDirectory(prefix="bench-jobs-") as tmp:
        work = Path(tmp)

        def run(name: str) -> tuple[int, float]:
            t0 = time.monotonic()
            with open(work / f"{name}.log", "wb") as log:
                command = [sys.executable, "-m", "benchmarks", name, *common, "--json", str(work / f"{name}.json")]
                code = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT).returncode
            return code, time.monotonic() - t0

        _log(f"{len(names)} scenarios, {args.jobs} at a time, each on its own embedded server, size {args.size}")
        outcomes: dict[str, tuple[int, float]] = {}
        with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
            futures = {pool.submit(run, name): name for name in order}
            for future in concurrent.futures.as_completed(futures):
                name = futures[future]
                outcomes[name] = future.result()
                _log(f"{name}: exit {outcomes[name][0]} in {outcomes[name][1]:.0f} s")
        results: dict[str, Any] = {"meta": {}, "scenarios": {}}
        for name in names:
            code, _ = outcomes[name]
            path = work / f"{name}.json"
            child = json.loads(path.read_text()) if path.exists() else None
            if code != 0 or child is None:
                sys.stderr.write((work / f"{name}.log").read_text(errors="replace")[-20_000:])
            if child is None:
                merged = {"data": {}, "rows": [], "targets": [], "seconds": outcomes[name][1], "failures": []}
            else:
                merged = child["scenarios"][name]
                results["meta"] = results["meta"] or {**child["meta"], "command": " ".join(sys.argv), "jobs": args.jobs}
            if code != 0 and not merged["failures"]:
                merged["failures"] = [f"{name}: its process exited with {code} (log above)"]
            results["scenarios"][name] = merged
    return results


def _parser(scenarios: list[str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument("scenario", choices=[*scenarios, "all"])
    parser.add_argument(
        "--brokers",
        default=",".join(BROKER_KINDS),
        help="comma-separated: redisson, builtin, redisson-lrem (default: all three)",
    )
    parser.add_argument("--size", choices=list(SIZES), default="small")
    parser.add_argument("--url", default=None, help="use this Redis/Valkey (default: start an embedded Valkey)")
    parser.add_argument("--json", dest="json_out", default=None, help="write the full results (with samples) here")
    parser.add_argument("--repeat", type=int, default=1, help="run each scenario N times; tables show medians")
    parser.add_argument(
        "--product",
        type=Path,
        default=None,
        help="import dramatiq_redisson from this tree, in the harness and in every worker process "
        "(e.g. a `git worktree` frozen at the commit to measure; default: the installed one)",
    )
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="PARAM=VALUE",
        help="override one of the size's parameters, e.g. --set lateness.rate=500 --set lateness.n=5000 "
        "(see SIZES in benchmarks/_base.py); repeatable",
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="all: run N scenarios at once, each in a process of its own with its own embedded server "
        "(the timings then share the machine: for checking that every scenario runs, as CI does, not for figures)",
    )
    parser.add_argument(
        "--stages",
        action="store_true",
        help="lateness scenarios: split each delayed message's lateness into its steps (see benchmarks/_stages.py)",
    )
    return parser


def _run_scenario(
    scenario: Callable[[Any], dict[str, Any]],
    name: str,
    args: argparse.Namespace,
    server: Server,
    brokers: list[str],
    ctx_class: Any,
) -> dict[str, Any]:
    """Run one scenario ``args.repeat`` times (a crash is a failure, never an abort); its
    result, merged by median over the repeats."""
    runs = []
    for _rep in range(args.repeat):
        ctx = ctx_class(server, args.size, sized(args.size, args.overrides), brokers, _log)
        t0 = time.monotonic()
        try:
            out = scenario(ctx)
        except Exception as e:
            traceback.print_exc()
            ctx.fail(f"{name}: crashed: {e!r}")
            out = {"data": {}, "rows": [], "targets": []}
        finally:
            try:
                server.slowlog_off()
                server.flush()
            except Exception:
                pass
        out["seconds"] = round(time.monotonic() - t0, 1)
        out["failures"] = ctx.failures
        runs.append(out)
    merged = (
        runs[0]
        if len(runs) == 1
        else {
            "data": runs[0]["data"],
            "runs_data": [r["data"] for r in runs],
            "rows": [median_merge(list(rs)) for rs in zip(*(r["rows"] for r in runs), strict=False)],
            "tables": {
                title: [
                    median_merge(list(rs))
                    for rs in zip(*(r.get("tables", {}).get(title, []) for r in runs), strict=False)
                ]
                for title in runs[0].get("tables", {})
            },
            "targets": [_merge_targets(list(ts)) for ts in zip(*(r["targets"] for r in runs), strict=False)],
            "seconds": round(sum(r["seconds"] for r in runs), 1),
            "failures": [f for r in runs for f in r["failures"]],
        }
    )
    return merged


def _print_scenario(name: str, merged: dict[str, Any], args: argparse.Namespace) -> None:
    """A scenario's tables and targets, as Markdown."""
    note = f", median of {args.repeat}" if args.repeat > 1 else ""
    print(f"\n## {name} ({args.size}, {merged['seconds']} s{note})\n")
    print_tables(merged)
    if merged["targets"]:
        print()
        print(
            format_table(
                [
                    {
                        "target": t["target"],
                        "value": t["value"],
                        "met": _verdict(t),
                    }
                    for t in merged["targets"]
                ]
            )
        )
    sys.stdout.flush()
