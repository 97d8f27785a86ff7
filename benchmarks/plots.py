"""One PNG per scenario from result JSON files.

python -m benchmarks.plots benchmarks/results/full-*.json --out benchmarks/plots
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

COLORS = {
    "redisson (control: nothing scheduled ahead)": "tab:purple",
    "redisson": "tab:blue",
    "builtin": "tab:orange",
    "redisson-lrem": "tab:green",
    "redisson-original (reference)": "tab:green",
    "limit (perfect placement)": "grey",
    # the field scenario's peers
    "celery": "tab:red",
    "huey": "tab:brown",
    "rq": "tab:olive",
}
LABELS = {
    "redisson": "RedissonBroker",
    "builtin": "dramatiq RedisBroker (built-in)",
    "redisson-lrem": "Redisson original transfer (LREM)",
}


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"figure.dpi": 110, "font.size": 10})
    return plt


def _cdf(ax: Any, samples: list[float], kind: str, note: str = "") -> None:
    if not samples:
        return
    s = sorted(max(x, 0.01) for x in samples)
    n = len(s)
    ax.step(
        s, [(i + 1) / n for i in range(n)], where="post", color=COLORS.get(kind), label=LABELS.get(kind, kind) + note
    )


def _title(meta: dict[str, Any], text: str) -> str:
    return f"{text}\n(size {meta.get('size')}, {meta.get('nproc')} cores, {meta.get('server')})"


def lateness_like(
    plt: Any, meta: dict[str, Any], data: dict[str, Any], title: str, xlabel: str, out: Path, targets: list[float]
) -> None:
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for kind, res in data.items():
        if not isinstance(res, dict) or "_lateness_samples" not in res:
            continue
        note = f" — ran {res['ran']}/{res['expected']}"
        lat = res["lateness_ms"]
        if lat["p99"] is not None:
            note += f", p99 {lat['p99']:.1f} ms"
        _cdf(ax, res["_lateness_samples"], kind, note)
    for t in targets:
        ax.axvline(t, color="grey", ls=":", lw=1)
        ax.text(t, 0.02, f" {t:g} ms target", color="grey", fontsize=8, rotation=90, va="bottom")
    ax.set_xscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("fraction of messages")
    ax.set_ylim(0, 1.01)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    ax.set_title(_title(meta, title), fontsize=10)
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)


def backlog(plt: Any, meta: dict[str, Any], data: dict[str, Any], out: Path) -> None:
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.5))
    for kind in ("redisson", "builtin", "redisson-lrem"):
        levels = data.get(kind)
        if not levels:
            continue
        xs = list(range(len(levels)))
        ticks = [f"{lv['backlog']:,}" for lv in levels]
        if kind == "redisson-lrem":
            per = [lv["script_us_per_moved"] for lv in levels]
            longest = [lv["longest_call_ms"] for lv in levels]
        else:
            per = [lv["move_only"]["script_us_per_moved"] for lv in levels]
            longest = [max(lv["move_only"]["longest_call_ms"], lv["longest_call_ms"]) for lv in levels]
        label = LABELS[kind] + (" (move-only, moved within window)" if kind == "builtin" else "")
        pts = [(x, y) for x, y in zip(xs, per, strict=False) if y is not None]
        if pts:
            a1.plot(*zip(*pts, strict=False), marker="o", color=COLORS[kind], label=label)
            for x, y in pts:
                a1.annotate(f"{y:.3g}", (x, y), textcoords="offset points", xytext=(4, 4), fontsize=8)
        a2.plot(xs, longest, marker="o", color=COLORS[kind], label=LABELS[kind])
        for x, y in zip(xs, longest, strict=False):
            a2.annotate(f"{y:.3g}", (x, y), textcoords="offset points", xytext=(4, 4), fontsize=8)
    a1.axhline(20, color="grey", ls=":", lw=1)
    a1.text(0, 20, " 20 µs target", color="grey", fontsize=8, va="bottom")
    a2.axhline(5, color="grey", ls=":", lw=1)
    a2.text(0, 5, " 5 ms target", color="grey", fontsize=8, va="bottom")
    for ax, ylabel in ((a1, "server script time per moved message (µs)"), (a2, "longest single script call (ms)")):
        ax.set_xticks(range(len(ticks)), ticks)
        ax.set_xlim(-0.3, len(ticks) - 0.5)
        ax.set_yscale("log")
        ax.set_xlabel("messages scheduled ahead (1 h)")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
    handles, names = a1.get_legend_handles_labels()
    fig.legend(handles, names, loc="lower center", ncol=3, fontsize=8)
    due = data.get("params", {}).get("due")
    fig.suptitle(
        _title(
            meta,
            f"Backlog cost: {due:,} messages due at once behind a backlog, moved by idle workers"
            " (reference: one loop, no workers)",
        ),
        fontsize=10,
    )
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    fig.savefig(out)
    plt.close(fig)


def memory(plt: Any, meta: dict[str, Any], data: dict[str, Any], out: Path) -> None:
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.5))
    kinds = [k for k in ("redisson", "builtin") if k in data]
    for i, kind in enumerate(kinds):
        server = [s for s in data[kind]["server"] if s["bytes_per_msg"]]
        xs = [j + i * 0.38 for j in range(len(server))]
        bars = a1.bar(xs, [s["bytes_per_msg"] for s in server], width=0.36, color=COLORS[kind], label=LABELS[kind])
        a1.bar_label(bars, fmt="%.0f", fontsize=8)
        a1.set_xticks([j + 0.19 for j in range(len(server))], [f"{s['scheduled']:,}" for s in server])
        rss = data[kind]["rss"]
        xs = list(range(len(rss)))
        a2.plot(xs, [r["rss_max_mb"] for r in rss], marker="o", color=COLORS[kind], label=LABELS[kind])
        for x, r in zip(xs, rss, strict=True):
            a2.annotate(
                f"{r['rss_max_mb']:.1f}", (x, r["rss_max_mb"]), textcoords="offset points", xytext=(4, 4), fontsize=8
            )
        a2.set_xticks(xs, [f"{r['scheduled']:,}" for r in rss])
    a1.set_xlabel("messages scheduled")
    a1.set_ylabel("server used_memory per scheduled message (bytes)")
    a1.legend(fontsize=8, loc="lower right")
    a1.set_ylim(top=a1.get_ylim()[1] * 1.1)
    a2.set_xlabel("messages scheduled")
    a2.set_ylabel("worker process RSS, larger of 2 (MB)")
    a2.set_ylim(bottom=0)
    a2.grid(True, alpha=0.3)
    a2.legend(fontsize=8)
    fig.suptitle(_title(meta, "Memory: server bytes per scheduled message, worker RSS"), fontsize=10)
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)


def offer(plt: Any, meta: dict[str, Any], data: dict[str, Any], out: Path) -> None:
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    med = data["median_rate"]
    names = list(med)
    colors = [COLORS.get(n.split("/")[0]) for n in names]
    bars = ax.bar(range(len(names)), [med[n] for n in names], color=colors)
    ax.bar_label(bars, fmt="%.0f", fontsize=8)
    nice = {
        "redisson/one": "RedissonBroker\none by one",
        "redisson/keyed": "RedissonBroker\none by one,\ndedupe_key",
        "redisson/bulk": "RedissonBroker\nenqueue_many",
        "builtin/one": "built-in\none by one",
    }
    ax.set_xticks(range(len(names)), [nice.get(n, n) for n in names])
    ax.axhline(50_000, color="grey", ls=":", lw=1)
    ax.text(-0.4, 50_000, "50 000/s bulk target", color="grey", fontsize=8, va="bottom")
    ax.set_ylabel("delayed messages offered per second (median)")
    ax.set_yscale("log")
    ax.grid(True, axis="y", which="both", alpha=0.3)
    ax.set_title(_title(meta, "Offer throughput, one producer process"), fontsize=10)
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)


def burst(plt: Any, meta: dict[str, Any], data: dict[str, Any], out: Path) -> None:
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.5))
    labels, times, colors, notes = [], [], [], []
    for kind, variants in data.items():
        if kind == "params":
            continue
        for variant, res in variants.items():
            labels.append(f"{kind}\n{variant}")
            t = res["move_all_after_first_due_ms"]
            times.append(t if t is not None else (data["params"]["timeout"] * 1000))
            colors.append(COLORS.get(kind))
            notes.append(
                f"{t / 1000:.2f} s" if t is not None else f">{data['params']['timeout']} s\n({res['moved']:,} moved)"
            )
            order = res.get("_order_sample") or []
            if order:
                a2.plot(
                    range(len(order)),
                    order,
                    ".",
                    ms=2,
                    color=COLORS.get(kind),
                    label=f"{kind}/{variant}: {res['inversion_fraction']:.3g} of pairs inverted",
                )
    bars = a1.bar(range(len(labels)), times, color=colors)
    for b, note in zip(bars, notes, strict=False):
        a1.annotate(note, (b.get_x() + b.get_width() / 2, b.get_height()), ha="center", va="bottom", fontsize=8)
    a1.axhline(2000, color="grey", ls=":", lw=1)
    a1.text(-0.4, 2000, "2 s target", color="grey", fontsize=8, va="bottom")
    a1.set_xticks(range(len(labels)), labels, fontsize=7)
    a1.set_yscale("log")
    a1.set_ylabel("time from the first due time until all moved (ms)")
    a1.grid(True, axis="y", which="both", alpha=0.3)
    a2.set_xlabel("position in the ready list (sampled)")
    a2.set_ylabel("offer order (message seq)")
    a2.legend(fontsize=7, markerscale=4)
    a2.grid(True, alpha=0.3)
    n = data.get("params", {}).get("n")
    fig.suptitle(_title(meta, f"Burst: {n:,} messages due at once, moved by 2 idle worker processes"), fontsize=10)
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)


def fleet(plt: Any, meta: dict[str, Any], data: dict[str, Any], out: Path) -> None:
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.5))
    p = data["params"]
    procs = p["procs"]
    for kind in ("redisson", "builtin"):
        if kind not in data:
            continue
        for mode, style in (("immediate", "-"), ("delayed", "--")):
            runs = [data[kind][mode].get(str(n)) for n in procs]
            pts = [(n, r) for n, r in zip(procs, runs, strict=True) if r]
            xs = [n for n, _ in pts]
            label = f"{LABELS[kind]}, {mode}"
            cpu = [r["server_cpu_us_per_msg"] for _, r in pts]
            a1.plot(xs, cpu, style, marker="o", color=COLORS[kind], label=label)
            for x, y in zip(xs, cpu, strict=True):
                a1.annotate(f"{y:.0f}", (x, y), textcoords="offset points", xytext=(4, 4), fontsize=8)
            p99 = [(n, r["lateness_ms"]["p99"]) for n, r in pts if r["lateness_ms"]["p99"] is not None]
            if p99:
                a2.plot(*zip(*p99, strict=True), style, marker="o", color=COLORS[kind], label=label)
    a2.axhline(5, color="grey", ls=":", lw=1)
    a2.text(procs[0], 5, " 5 ms target", color="grey", fontsize=8, va="bottom")
    for ax, ylabel in (
        (a1, "server CPU per message (µs, INFO cpu)"),
        (a2, "lateness p99 (ms, log scale)"),
    ):
        ax.set_xscale("log")
        ax.set_xticks(procs, [str(n) for n in procs])
        ax.minorticks_off()
        ax.set_xlabel("worker processes (1 thread each)")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
    a1.set_ylim(bottom=0)
    a2.set_yscale("log")
    a2.set_title("start − due (delayed), start − send (immediate)", fontsize=9)
    handles, names = a1.get_legend_handles_labels()
    fig.legend(handles, names, loc="lower center", ncol=2, fontsize=8)
    fig.suptitle(
        _title(
            meta,
            f"Fleet: {p['rate']} messages/s for {p['window']} s, plain and delayed {p['delay']} ms"
            f" — dramatiq_redisson at git {meta.get('git')}",
        ),
        fontsize=10,
    )
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    fig.savefig(out)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.plots")
    parser.add_argument("files", nargs="+")
    parser.add_argument("--out", default=str(Path(__file__).parent / "plots"))
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    plt = _plt()
    for f in args.files:
        results = json.loads(Path(f).read_text())
        meta = results["meta"]
        for name, sc in results["scenarios"].items():
            data = sc.get("data") or {}
            if not data or len(data) <= 1:
                continue
            path = out / f"{name}.png"
            try:
                _plot(plt, name, meta, data, path)
            except Exception as e:  # an old or partial result file: say so, go on
                print(f"{f}: no plot for {name}: {e!r}")
                continue
            print(path)
    return 0


def _plot(plt: Any, name: str, meta: dict[str, Any], data: dict[str, Any], path: Path) -> None:
    if name == "lateness":
        lateness_like(
            plt,
            meta,
            data,
            "Lateness: start − due, delays uniform 0.2–3 s, 2 processes × 4 threads",
            "lateness (ms, log scale)",
            path,
            [5, 50],
        )
    elif name == "lateness-paced":
        p = data["params"]
        lateness_like(
            plt,
            meta,
            data,
            f"Lateness, paced: {p['n']:,} messages offered at {p['rate']}/s, delays uniform 0.2–3 s",
            "lateness (ms, log scale)",
            path,
            [5, 50],
        )
    elif name == "head-of-line":
        p = data["params"]
        lateness_like(
            plt,
            meta,
            data,
            f"Head-of-line: {p['near']} due in 1 s behind {p['far']:,} due in 1 h ({p['window']} s window)",
            "lateness of the near messages (ms, log scale)",
            path,
            [5],
        )
    elif name == "idle":
        lateness_like(
            plt,
            meta,
            data,
            "Idle pickup: send() to actor start, idle workers",
            "pickup time (ms, log scale)",
            path,
            [5],
        )
    elif name == "backlog":
        backlog(plt, meta, data, path)
    elif name == "memory":
        memory(plt, meta, data, path)
    elif name == "offer":
        offer(plt, meta, data, path)
    elif name == "burst":
        burst(plt, meta, data, path)
    elif name == "fleet":
        fleet(plt, meta, data, path)
    elif name == "field":
        p = data["params"]
        lateness_like(
            plt,
            meta,
            data,
            f"field: {p['n']:,} jobs delayed {p['delay_lo'] / 1000:g}–{p['delay_hi'] / 1000:g} s at {p['rate']}/s, "
            "five job queues",
            "lateness (ms, log scale; early runs drawn at 0.01)",
            path,
            [],
        )
    elif name.startswith("work-"):
        p = data["params"]
        shown = {k: v for k, v in data.items() if k != "limit"}
        limit = data.get("limit")
        if limit:  # the simulated queue's waits, drawn like a broker's lateness
            n = limit["wait_ms"]["n"]
            shown["limit (perfect placement)"] = {
                "_lateness_samples": limit["_lateness_samples"],
                "ran": n,
                "expected": n,
                "lateness_ms": limit["wait_ms"],
            }
        how = (
            "sent without a delay" if p["immediate"] else f"delays {p['delay_lo'] / 1000:g}–{p['delay_hi'] / 1000:g} s"
        )
        lateness_like(
            plt,
            meta,
            shown,
            f"{name}: {p['n']:,} messages at {p['rate']}/s, {how}, actor {p['kind']} {p['work_ms']} ms, "
            f"{p['procs']} × {p['threads']} workers",
            "lateness (ms, log scale)",
            path,
            [],
        )


if __name__ == "__main__":
    raise SystemExit(main())
