"""``python -m benchmarks.ab``: this working tree against a git ref, interleaved, with a verdict.

Each round runs every chosen scenario once for each side, as a fresh
``python -m benchmarks SCENARIO --product DIR`` process (its own embedded server, its own
worker processes), the order of the two sides alternating from round to round, so that
the machine's drift and noise fall on both alike. The ref's ``dramatiq_redisson`` is
exported with ``git archive`` into a temporary directory; the harness is this tree's on
both sides (``--product`` only swaps the package under test).

Per scenario it prints each round's figures, the medians of both sides, and a verdict
on lateness p99 and max, server CPU and commands per message (and, for ``offer``, the
one-by-one rate vs the built-in broker's in the same run; for the ``work-*`` scenarios,
the busiest worker process's share of the runs and the messages started per second
too; for ``script-cost``, the instructions per call of each phase, in one round: callgrind
counts the same run after run): ``better`` or ``worse`` when
the medians differ by more than the noise margin *and* the tree wins (or loses) at least
two thirds of the rounds, else ``same``. The exit code is 1 when any scenario failed
(lost, duplicated or early messages, a crash) on either side, 2 when a verdict is
``worse`` (so that a script can stop on it), else 0.

Examples::

    python -m benchmarks.ab                       # vs the last tag, or origin/main, or HEAD
    python -m benchmarks.ab --ref 8d27b2a --rounds 6 lateness-paced lateness
    python -m benchmarks.ab --ref HEAD~3 --rounds 4 --size small offer
    python -m benchmarks.ab --ref main --rounds 3 work-io work-cpu work-io-immediate work-io-90
    python -m benchmarks.ab --ref main script-cost  # one round whatever --rounds says
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .cli import fmt, format_table

ROOT = Path(__file__).resolve().parent.parent

#: Scenarios the comparison knows how to read, with the size each runs at by default:
#: lateness-paced at full size is 2 000 delayed messages offered at 200/s to 2 × 4 workers;
#: lateness at small size is 4 000 offered as fast as one producer goes (~500/s here).
DEFAULT_SIZES = {
    "lateness-paced": "full",
    "lateness": "small",
    "immediate-paced": "full",
    "backlog": "small",
    "offer": "small",
    # Actors that take time (issue 46), 2 × 4 workers: 1 200 messages sleeping 50 ms at
    # 80/s, 900 burning 10 ms of CPU at 60/s, 1 200 sleeping sent without a delay, 2 100
    # sleeping at 140/s, 1 600 burning at 110/s.
    "work-io": "full",
    "work-cpu": "full",
    "work-io-immediate": "full",
    "work-io-90": "full",
    "work-cpu-90": "full",
    # The tracing middleware on OpenTelemetry's no-op API (issue 49): lateness-paced's and
    # immediate-paced's workloads; a ref without dramatiq_redisson.tracing runs without it.
    "lateness-paced-otel": "full",
    "immediate-paced-otel": "full",
    # Instructions per script call under callgrind (issue 55): 300 calls per phase.
    "script-cost": "small",
}
#: Parameters each scenario runs with here (``python -m benchmarks --set``): lateness paced
#: at 500/s, so that a faster offer does not also raise the load it is measured under;
#: backlog: 1 000 due at once behind 0 and 100 000 scheduled.
DEFAULT_SETS = {
    "lateness": ["lateness.rate=500", "lateness.n=5000"],
    "backlog": ["backlog.levels=[0,100000]", "backlog.due=1000"],
}
DEFAULT_SCENARIOS = ["lateness-paced", "lateness"]

#: A median must move by more than this fraction (and the rounds must agree) for a verdict
#: other than "same": these machines have 2 shared cores.
NOISE = {
    "p50": 0.15,
    "p99": 0.25,
    "max": 0.35,
    # backlog: the longest time between two consecutive starts of the burst (a max).
    "gap": 0.35,
    "cpu us/msg": 0.08,
    "commands/msg": 0.02,
    "offer vs builtin": 0.05,
    # work-*: the busiest process's share of the runs (50 % = even over 2 processes): a
    # guess, no repeated rounds have measured its spread yet; started/s is pinned by the
    # due times while the workers keep up, and drops when they fall behind.
    "busiest share %": 0.10,
    "throughput/s": 0.03,
    # script-cost: instructions counted by callgrind, the same run after run within ~0.5 %.
    "k instr": 0.01,
}
#: Rounds a scenario needs at most (its figures do not vary from run to run).
MAX_ROUNDS = {"script-cost": 1}
#: Whether a larger value is better.
HIGHER_IS_BETTER = {"offer vs builtin": True, "offer/s": True, "throughput/s": True}


def _log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def default_ref() -> str:
    """The last release tag, else ``origin/main``, else ``HEAD`` (the last commit)."""
    tag = _git("describe", "--tags", "--abbrev=0", check=False)
    if tag:
        return tag
    if _git("rev-parse", "--verify", "--quiet", "origin/main", check=False):
        return "origin/main"
    return "HEAD"


def _git(*args: str, check: bool = True) -> str:
    proc = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise SystemExit(f"git {' '.join(args)} failed: {proc.stderr.strip()}")
    return proc.stdout.strip() if proc.returncode == 0 else ""


def export_ref(ref: str, into: Path) -> str:
    """``dramatiq_redisson`` as of ``ref`` into ``into``; returns the commit's short id."""
    commit = _git("rev-parse", "--short", f"{ref}^{{commit}}")
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", commit, "dramatiq_redisson"], capture_output=True, check=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return commit


# -- reading one run's JSON -----------------------------------------------------------


def _lateness_figures(data: dict[str, Any]) -> dict[str, float | None]:
    ours = data.get("redisson") or {}
    lat = ours.get("lateness_ms") or {}
    return {
        "p50": lat.get("p50"),
        "p99": lat.get("p99"),
        "max": lat.get("max"),
        "cpu us/msg": ours.get("server_cpu_us_per_msg"),
        "commands/msg": ours.get("commands_per_msg"),
        "offer/s": ours.get("offer_rate"),
    }


def _work_figures(data: dict[str, Any]) -> dict[str, float | None]:
    """A ``work-*`` run: RedissonBroker's lateness, the busiest worker process's share of
    the runs (%), messages started per second, server CPU and commands per message."""
    ours = data.get("redisson") or {}
    figures = _lateness_figures(data)
    return {
        "p50": figures["p50"],
        "p99": figures["p99"],
        "max": figures["max"],
        "busiest share %": ours.get("busiest_share_pct"),
        "throughput/s": ours.get("throughput"),
        "cpu us/msg": ours.get("server_cpu_us_per_msg"),
        "commands/msg": ours.get("commands_per_msg"),
    }


def _backlog_figures(data: dict[str, Any]) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for level in data.get("redisson") or []:
        lat = level.get("lateness_ms") or {}
        out[f"p99 @{level['backlog']}"] = lat.get("p99")
        out[f"max @{level['backlog']}"] = lat.get("max")
        out[f"gap @{level['backlog']}"] = level.get("longest_gap_ms")
    return out


def _offer_figures(data: dict[str, Any]) -> dict[str, float | None]:
    med = data.get("median_rate") or {}
    ours, theirs = med.get("redisson/one"), med.get("builtin/one")
    return {
        "offer/s": ours,
        "builtin offer/s": theirs,
        "offer vs builtin": round(ours / theirs, 3) if ours and theirs else None,
    }


def _script_cost_figures(data: dict[str, Any]) -> dict[str, float | None]:
    """Thousands of instructions per call, per phase (``k instr @<phase>``)."""
    return {
        f"k instr @{name}": round(phase["instructions_per_call"] / 1000, 1)
        for name, phase in (data.get("phases") or {}).items()
    }


READERS: dict[str, Callable[[dict[str, Any]], dict[str, float | None]]] = {
    "lateness-paced": _lateness_figures,
    "lateness": _lateness_figures,
    "immediate-paced": _lateness_figures,
    "backlog": _backlog_figures,
    "offer": _offer_figures,
    "work-io": _work_figures,
    "work-cpu": _work_figures,
    "work-io-immediate": _work_figures,
    "work-io-90": _work_figures,
    "work-cpu-90": _work_figures,
    "lateness-paced-otel": _lateness_figures,
    "immediate-paced-otel": _lateness_figures,
    "script-cost": _script_cost_figures,
}
#: The brokers each scenario runs with (the built-in broker only where a ratio needs it).
BROKERS = {"offer": "redisson,builtin"}


def run_side(scenario: str, size: str, product: Path, out: Path, url: str | None, sets: list[str]) -> dict[str, Any]:
    """One ``python -m benchmarks`` run of ``scenario`` on ``product``; its figures, and
    ``failed`` when the run reported lost, duplicated or early messages or a crash."""
    cmd = [
        sys.executable,
        "-m",
        "benchmarks",
        scenario,
        "--brokers",
        BROKERS.get(scenario, "redisson"),
        "--size",
        size,
        "--product",
        str(product),
        "--json",
        str(out),
    ]
    if url:
        cmd += ["--url", url]
    for item in sets:
        cmd += ["--set", item]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env)
    if not out.exists():
        tail = "\n".join((proc.stderr or proc.stdout).splitlines()[-15:])
        return {"failed": [f"no results (exit {proc.returncode}): {tail}"], "figures": {}}
    results = json.loads(out.read_text())
    data = results["scenarios"][scenario]["data"]
    failed = list(results.get("failures") or [])
    if proc.returncode != 0 and not failed:
        failed.append(f"exit code {proc.returncode}")
    return {"failed": failed, "figures": READERS[scenario](data), "git": results["meta"].get("git")}


# -- the comparison -------------------------------------------------------------------


def verdict(key: str, tree: list[float], ref: list[float]) -> str:
    """``better``/``worse``/``same`` for one figure over paired rounds (see the module)."""
    pairs = [(t, r) for t, r in zip(tree, ref, strict=False) if t is not None and r is not None]
    if not pairs:
        return "-"
    mt, mr = statistics.median(t for t, _ in pairs), statistics.median(r for _, r in pairs)
    higher = HIGHER_IS_BETTER.get(key, False)
    margin = NOISE.get(key.split(" @")[0], 0.25)
    wins = sum(1 for t, r in pairs if (t > r if higher else t < r))
    losses = sum(1 for t, r in pairs if (t < r if higher else t > r))
    base = abs(mr) if mr else 1e-9
    change = (mt - mr) / base
    improved = change > margin if higher else change < -margin
    regressed = change < -margin if higher else change > margin
    need = (2 * len(pairs) + 2) // 3
    if improved and wins >= need:
        return "better"
    if regressed and losses >= need:
        return "worse"
    return "same"


def report(scenario: str, rounds: list[dict[str, Any]], ref_name: str, names: list[str]) -> list[str]:
    """The scenario's Markdown table (one row per round and side, then the medians and the
    verdict per figure); returns the verdicts."""
    keys: list[str] = []
    for r in rounds:
        for side in names:
            for k in r[side]["figures"]:
                if k not in keys:
                    keys.append(k)
    print(f"\n## {scenario}: working tree vs {ref_name}\n")
    rows: list[dict[str, Any]] = []
    for i, r in enumerate(rounds, 1):
        for side in r["order"]:
            rows.append({"round": i, "side": side, **{k: r[side]["figures"].get(k) for k in keys}})
    series = {side: {k: [r[side]["figures"].get(k) for r in rounds] for k in keys} for side in names}

    def med(vals: list[Any]) -> Any:
        vals = [v for v in vals if v is not None]
        return round(statistics.median(vals), 3) if vals else None

    for side in names:
        rows.append({"round": "median", "side": side, **{k: med(series[side][k]) for k in keys}})
    verdicts = [verdict(k, series["tree"][k], series["ref"][k]) for k in keys]
    rows.append({"round": "verdict", "side": "tree", **dict(zip(keys, verdicts, strict=True))})
    print(format_table(rows))
    return verdicts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.ab", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "scenarios", nargs="*", help=f"any of {', '.join(READERS)} (default: {' '.join(DEFAULT_SCENARIOS)})"
    )
    parser.add_argument(
        "--ref", default=None, help="git ref to compare with (default: the last tag, origin/main or HEAD)"
    )
    parser.add_argument("--rounds", type=int, default=6, help="interleaved rounds (default 6)")
    parser.add_argument(
        "--size", default=None, help="one size for every scenario (default: per scenario, see DEFAULT_SIZES)"
    )
    parser.add_argument("--tree", type=Path, default=ROOT, help="the tree on the other side (default: this checkout)")
    parser.add_argument("--url", default=None, help="a server for both sides (default: each run starts its own)")
    parser.add_argument(
        "--set",
        dest="sets",
        action="append",
        default=[],
        metavar="PARAM=VALUE",
        help="passed to every run (python -m benchmarks --set), after the defaults of DEFAULT_SETS",
    )
    parser.add_argument(
        "--also",
        action="append",
        default=[],
        metavar="REF",
        help="measure this ref (or tree: a directory holding dramatiq_redisson) too, in the same interleaved "
        "rounds (e.g. the commits of a bisect, or variants of a change); repeatable",
    )
    parser.add_argument("--keep", type=Path, default=None, help="keep every run's JSON in this directory")
    args = parser.parse_args(argv)
    scenarios = args.scenarios or DEFAULT_SCENARIOS
    for scenario in scenarios:
        if scenario not in READERS:
            parser.error(f"unknown scenario {scenario!r}: choose from {', '.join(READERS)}")
    ref = args.ref or default_ref()
    work = Path(tempfile.mkdtemp(prefix="bench-ab-"))
    exit_code = 0
    try:
        ref_dir = work / "ref"
        ref_dir.mkdir()
        commit = export_ref(ref, ref_dir)
        ref_name = ref if commit.startswith(ref) else f"{ref} ({commit})"
        tree = args.tree.resolve()
        products = {"tree": tree, "ref": ref_dir}
        for extra in args.also:
            if (Path(extra) / "dramatiq_redisson").is_dir():
                products[extra] = Path(extra).resolve()  # a tree, e.g. a variant being tried
                continue
            extra_dir = work / f"also-{len(products)}"
            extra_dir.mkdir()
            extra_commit = export_ref(extra, extra_dir)
            products[extra if extra_commit.startswith(extra) else f"{extra} ({extra_commit})"] = extra_dir
        _log(
            f"working tree {tree} (at {_git('rev-parse', '--short', 'HEAD')}) vs {ref_name}"
            + (f", also {', '.join(list(products)[2:])}" if args.also else "")
            + f", {args.rounds} rounds"
        )
        runs: dict[str, list[dict[str, Any]]] = {s: [] for s in scenarios}
        names = list(products)
        for i in range(args.rounds):
            # Each round in another order: the first two sides swap every round, and the
            # others rotate, so that no side always runs first or after the same one.
            order = names[i % len(names) :] + names[: i % len(names)] if len(names) > 2 else names
            if len(names) == 2 and i % 2:
                order = order[::-1]
            for scenario in scenarios:
                if i >= MAX_ROUNDS.get(scenario, args.rounds):
                    continue
                size = args.size or DEFAULT_SIZES[scenario]
                result: dict[str, Any] = {"order": order}
                for side in order:
                    out = (args.keep or work) / f"{scenario}-{i + 1}-{names.index(side)}.json"
                    out.parent.mkdir(parents=True, exist_ok=True)
                    t0 = time.monotonic()
                    result[side] = run_side(
                        scenario,
                        size,
                        products[side],
                        out,
                        args.url,
                        [*DEFAULT_SETS.get(scenario, []), *args.sets],
                    )
                    fig = result[side]["figures"]
                    shown = ", ".join(f"{k} {fmt(v)}" for k, v in list(fig.items())[:5])
                    _log(f"round {i + 1} {scenario} {side}: {shown} ({time.monotonic() - t0:.0f} s)")
                    for f in result[side]["failed"]:
                        _log(f"  FAILED ({side}): {f}")
                        exit_code = 1
                runs[scenario].append(result)
        worse = False
        for scenario in scenarios:
            verdicts = report(scenario, runs[scenario], ref_name, names)
            worse = worse or "worse" in verdicts
        print(
            "\nverdict: better/worse = the medians differ by more than the noise margin "
            f"({', '.join(f'{k} {int(v * 100)} %' for k, v in NOISE.items())}) and the tree wins/loses "
            "at least two thirds of the rounds; else same."
        )
        if worse and exit_code == 0:
            exit_code = 2
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return exit_code


if __name__ == "__main__":
    sys.exit(main())
