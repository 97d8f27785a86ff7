"""Markdown tables from result JSON files (what benchmarks/README.md shows).

python -m benchmarks.report benchmarks/results/full-*.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from .cli import _verdict, format_table, print_tables


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.report")
    parser.add_argument("files", nargs="+")
    args = parser.parse_args(argv)
    targets = []
    for f in args.files:
        results = json.loads(Path(f).read_text())
        meta = results["meta"]
        for name, sc in results["scenarios"].items():
            reps = meta.get("repeat", 1)
            note = f"median of {reps} runs" if reps > 1 else "1 run"
            print(f"### {name}\n")
            cmd = meta.get("command", "")
            print(f"`{cmd}` — size {meta['size']}, {note}, {sc['seconds']} s, git {meta.get('git')}\n")
            print_tables(sc)
            print()
            targets += [(name, t) for t in sc["targets"]]
    print("### targets\n")
    print(
        format_table(
            [{"scenario": n, "target": t["target"], "value": t["value"], "verdict": _verdict(t)} for n, t in targets]
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
