"""The harness's base: the bench queue and namespace, the broker kinds, the per-size
parameters of every scenario (``SIZES``), and small helpers every part shares. It imports
no other module of the harness, and nothing of the product."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent

QUEUE = "bench"
NAMESPACE = "dramatiq"
BROKER_KINDS = ("redisson", "builtin", "redisson-lrem")
PRODUCT_KINDS = ("redisson", "redisson-lrem")  # brokers whose lost/duplicated messages fail the run
HOUR_MS = 3_600_000


def _work(
    kind: str,
    work_ms: int,
    rate: int,
    n: int,
    *,
    immediate: bool = False,
    delays: tuple[int, int] = (1000, 3000),
    timeout: int = 60,
    procs: int = 2,
    threads: int = 4,
) -> dict[str, Any]:
    """The parameters of one ``work-*`` scenario (``scenarios/work.py``): ``n`` messages
    offered at ``rate``/s, delayed uniformly in ``delays`` ms (or sent without a delay), to
    ``procs`` × ``threads`` workers whose actor sleeps (``kind`` "sleep") or burns CPU
    ("cpu") for ``work_ms`` after recording its start."""
    return {
        "kind": kind,
        "work_ms": work_ms,
        "rate": rate,
        "n": n,
        "procs": procs,
        "threads": threads,
        "immediate": immediate,
        "delay_lo": 0 if immediate else delays[0],
        "delay_hi": 0 if immediate else delays[1],
        "timeout": timeout,
    }


def _workflow(*, runs: int, members: int, cost_n: int, send_n: int, send_repeat: int, timeout: int) -> dict[str, Any]:
    """The parameters of the ``workflow`` scenario (``scenarios/workflow.py``): ``runs``
    fan-outs of ``members`` no-op steps and one completion step each (``timeout`` s for
    each run); ``cost_n`` steps sent as plain messages, then as chains of ``chain`` steps
    (100: long enough that what a workflow costs once, its record and its end, about ten
    commands and one script call, adds a tenth of a command per step; ``--set
    workflow.chain=10`` shows it);
    a group of ``send_n`` steps run against ``enqueue_many`` of as many messages,
    ``send_repeat`` times each. ``settle``: seconds after the last record before the
    server's statistics are read; ``grace``: after the last run, for late duplicates."""
    return {
        "runs": runs,
        "members": members,
        "cost_n": cost_n,
        "chain": 100,
        "send_n": send_n,
        "send_repeat": send_repeat,
        "timeout": timeout,
        "settle": 0.3,
        "grace": 1.0,
    }


#: Per-size parameters of every scenario. "full" is the size the issue asks for.
SIZES: dict[str, dict[str, Any]] = {
    "tiny": {
        "procs": 2,
        "threads": 4,
        "lateness": {"n": 120, "delay_lo": 200, "delay_hi": 1500, "timeout": 30},
        "lateness_paced": {"n": 60, "delay_lo": 200, "delay_hi": 800, "timeout": 30, "rate": 100},
        "immediate_paced": {"n": 60, "delay_lo": 0, "delay_hi": 0, "timeout": 30, "rate": 100, "immediate": True},
        "hol": {"far": 2_000, "near": 100, "near_delay": 1000, "window": 5},
        "fair_share": {
            "backlog": 4_000,
            "front": 30,
            "rate": 100,
            "started": 200,
            "settle": 0.5,
            "window": 5,
            "timeout": 30,
        },
        "priority": {
            "backlog": 4_000,
            "front": 30,
            "rate": 100,
            "started": 200,
            "settle": 0.5,
            "window": 5,
            "timeout": 30,
        },
        "flow_cost": {
            "few_groups": 100,
            "many_groups": 2_000,
            "queued_low": 4_000,
            "queued_high": 20_000,
            "fetches": 1_000,
        },
        "rate_limit": {"n": 60, "rate": 20, "per_ms": 1000, "timeout": 8},
        "work_io": _work("sleep", 50, 80, 100, delays=(500, 1500), timeout=30),
        "work_cpu": _work("cpu", 10, 60, 80, delays=(500, 1500), timeout=30),
        "work_io_immediate": _work("sleep", 50, 80, 100, immediate=True, timeout=30),
        "work_io_90": _work("sleep", 50, 140, 120, delays=(500, 1500), timeout=30),
        "work_cpu_90": _work("cpu", 10, 110, 110, delays=(500, 1500), timeout=30),
        "backlog": {"levels": [2_000], "due": 200, "delay": 1000, "window": 5, "timeout": 30, "ref_budget": 2},
        "memory": {"levels": [0, 2_000], "settle": 0.5},
        "offer": {"one": 300, "bulk": 2_000, "repeat": 1},
        "idle": {"n": 20, "gap_lo": 20, "gap_hi": 80, "settle": 0.5},
        "script_cost": {"n": 50},  # calls per phase: a multiple of 50 (see scenarios/script_cost.py)
        "workflow": _workflow(runs=2, members=50, cost_n=200, send_n=500, send_repeat=1, timeout=20),
        "burst": {"n": 1_000, "delay": 1500, "timeout": 30},
        "saturation": {"rates": [100, 400], "stage_s": 2, "delay": 500, "tick_ms": 20, "timeout": 10, "p99_ms": 50},
        "fleet": {
            "procs": [2, 3],
            "rate": 150,
            "window": 2,
            "delay": 1000,
            "settle": 0.5,
            "timeout": 30,
            "liveness_idle": 2.0,
        },
        "field": {
            "systems": ["redisson", "builtin", "celery", "huey", "rq"],
            "n": 60,
            "rate": 100,
            "delay_lo": 200,
            "delay_hi": 1000,
            "procs": 2,
            "threads": 4,
            "rq_procs": 8,
            "scheduled": 2_000,
            "warm_ms": 200,
            "settle": 0.3,
            "grace": 0.5,
            "timeout": 30,
        },
        "cluster": {
            "queues": 6,
            "settle": 0.5,
            "cost_repeat": 1,
            "offer_one": 300,
            "offer_bulk": 2_000,
            "move": 2_000,
            "move_delay": 800,
            "paced_n": 100,
            "rate": 100,
            "delay_lo": 200,
            "delay_hi": 500,
            "burst_per_queue": 100,
            "burst_delay": 800,
            "failover_repeats": 1,
            "failover_rate": 100,
            "failover_delay_lo": 300,
            "failover_delay_hi": 1000,
            "warm": 1.0,
            "after": 0.5,
            "timeout": 30,
        },
    },
    "small": {
        "procs": 2,
        "threads": 4,
        "lateness": {"n": 4_000, "delay_lo": 200, "delay_hi": 3000, "timeout": 60},
        "lateness_paced": {"n": 500, "delay_lo": 200, "delay_hi": 3000, "timeout": 60, "rate": 100},
        "immediate_paced": {"n": 500, "delay_lo": 0, "delay_hi": 0, "timeout": 30, "rate": 100, "immediate": True},
        "hol": {"far": 20_000, "near": 200, "near_delay": 1000, "window": 10},
        "fair_share": {
            "backlog": 20_000,
            "front": 100,
            "rate": 50,
            "started": 500,
            "settle": 0.5,
            "window": 20,
            "timeout": 60,
        },
        "priority": {
            "backlog": 20_000,
            "front": 100,
            "rate": 50,
            "started": 500,
            "settle": 0.5,
            "window": 20,
            "timeout": 60,
        },
        "flow_cost": {
            "few_groups": 1_000,
            "many_groups": 10_000,
            "queued_low": 10_000,
            "queued_high": 100_000,
            "fetches": 3_000,
        },
        "rate_limit": {"n": 300, "rate": 50, "per_ms": 1000, "timeout": 40},
        "work_io": _work("sleep", 50, 80, 400),
        "work_cpu": _work("cpu", 10, 60, 300),
        "work_io_immediate": _work("sleep", 50, 80, 400, immediate=True),
        "work_io_90": _work("sleep", 50, 140, 700),
        "work_cpu_90": _work("cpu", 10, 110, 540),
        "backlog": {
            "levels": [0, 10_000, 100_000],
            "due": 2_000,
            "delay": 1500,
            "window": 10,
            "timeout": 60,
            "ref_budget": 10,
        },
        "memory": {"levels": [0, 10_000, 100_000], "settle": 2.0},
        "offer": {"one": 5_000, "bulk": 20_000, "repeat": 3},
        "idle": {"n": 100, "gap_lo": 50, "gap_hi": 150},
        "script_cost": {"n": 300},
        "workflow": _workflow(runs=10, members=1_000, cost_n=1_000, send_n=10_000, send_repeat=3, timeout=30),
        "burst": {"n": 20_000, "delay": 2500, "timeout": 60},
        "saturation": {
            "rates": [250, 500, 1000, 2000, 3000],
            "stage_s": 4,
            "delay": 1000,
            "tick_ms": 20,
            "timeout": 15,
            "p99_ms": 50,
        },
        "fleet": {
            "procs": [2, 8],
            "rate": 150,
            "window": 10,
            "delay": 1000,
            "settle": 1.0,
            "timeout": 60,
            "liveness_idle": 5.0,
        },
        "field": {
            "systems": ["redisson", "builtin", "celery", "huey", "rq"],
            "n": 1_000,
            "rate": 200,
            "delay_lo": 1000,
            "delay_hi": 5000,
            "procs": 2,
            "threads": 4,
            "rq_procs": 8,
            "scheduled": 20_000,
            "warm_ms": 200,
            "settle": 1.0,
            "grace": 0.5,
            "timeout": 60,
        },
        "cluster": {
            "queues": 12,
            "settle": 1.0,
            "cost_repeat": 1,
            "offer_one": 3_000,
            "offer_bulk": 20_000,
            "move": 10_000,
            "move_delay": 2000,
            "paced_n": 1_000,
            "rate": 200,
            "delay_lo": 200,
            "delay_hi": 2000,
            "burst_per_queue": 500,
            "burst_delay": 2000,
            "failover_repeats": 2,
            "failover_rate": 200,
            "failover_delay_lo": 300,
            "failover_delay_hi": 1500,
            "warm": 2.0,
            "after": 2.0,
            "timeout": 60,
        },
    },
    "full": {
        "procs": 2,
        "threads": 4,
        "lateness": {"n": 20_000, "delay_lo": 200, "delay_hi": 3000, "timeout": 120},
        "lateness_paced": {"n": 2_000, "delay_lo": 200, "delay_hi": 3000, "timeout": 60, "rate": 200},
        "immediate_paced": {"n": 2_000, "delay_lo": 0, "delay_hi": 0, "timeout": 30, "rate": 200, "immediate": True},
        "hol": {"far": 100_000, "near": 1_000, "near_delay": 1000, "window": 30},
        "fair_share": {
            "backlog": 50_000,
            "front": 100,
            "rate": 50,
            "started": 1_000,
            "settle": 1.0,
            "window": 60,
            "timeout": 120,
        },
        "priority": {
            "backlog": 30_000,
            "front": 100,
            "rate": 50,
            "started": 1_000,
            "settle": 1.0,
            "window": 60,
            "timeout": 120,
        },
        "flow_cost": {
            "few_groups": 1_000,
            "many_groups": 100_000,
            "queued_low": 100_000,
            "queued_high": 1_000_000,
            "fetches": 5_000,
        },
        "rate_limit": {"n": 1000, "rate": 100, "per_ms": 1000, "timeout": 60},
        "work_io": _work("sleep", 50, 80, 1_200),
        "work_cpu": _work("cpu", 10, 60, 900),
        "work_io_immediate": _work("sleep", 50, 80, 1_200, immediate=True),
        "work_io_90": _work("sleep", 50, 140, 2_100),
        "work_cpu_90": _work("cpu", 10, 110, 1_600),
        "backlog": {
            "levels": [0, 100_000, 1_000_000],
            "due": 10_000,
            "delay": 2500,
            "window": 30,
            "timeout": 120,
            "ref_budget": 30,
        },
        "memory": {"levels": [0, 100_000, 1_000_000], "settle": 3.0},
        "offer": {"one": 20_000, "bulk": 100_000, "repeat": 3},
        "idle": {"n": 300, "gap_lo": 50, "gap_hi": 150},
        "script_cost": {"n": 1000},
        "workflow": _workflow(runs=20, members=1_000, cost_n=2_000, send_n=10_000, send_repeat=5, timeout=60),
        "burst": {"n": 100_000, "delay": 6000, "timeout": 60},
        "saturation": {
            "rates": [500, 1000, 1500, 2000, 3000, 4000, 5000, 6000, 8000],
            "stage_s": 10,
            "delay": 1000,
            "tick_ms": 20,
            "timeout": 30,
            "p99_ms": 50,
        },
        "fleet": {
            "procs": [2, 8, 24],
            "rate": 150,
            "window": 20,
            "delay": 1000,
            "settle": 1.0,
            "timeout": 60,
            "liveness_idle": 10.0,
        },
        "field": {
            "systems": ["redisson", "builtin", "celery", "huey", "rq"],
            "n": 4_000,
            "rate": 200,
            "delay_lo": 1000,
            "delay_hi": 5000,
            "procs": 2,
            "threads": 4,
            "rq_procs": 8,
            "scheduled": 100_000,
            "warm_ms": 200,
            "settle": 2.0,
            "grace": 0.5,
            "timeout": 60,
        },
        "cluster": {
            "queues": 12,
            "settle": 1.0,
            "cost_repeat": 3,
            "offer_one": 10_000,
            "offer_bulk": 100_000,
            "move": 50_000,
            "move_delay": 3000,
            "paced_n": 3_000,
            "rate": 200,
            "delay_lo": 200,
            "delay_hi": 3000,
            "burst_per_queue": 1_000,
            "burst_delay": 2500,
            "failover_repeats": 5,
            "failover_rate": 200,
            "failover_delay_lo": 300,
            "failover_delay_hi": 1500,
            "warm": 3.0,
            "after": 3.0,
            "timeout": 60,
        },
    },
}


def quiet_logging() -> None:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(process)d %(name)s %(levelname)s %(message)s")
    for name in ("dramatiq", "dramatiq_redisson"):
        logging.getLogger(name).setLevel(logging.WARNING)


def dumps(obj: Any) -> str:
    return json.dumps(obj, indent=1, sort_keys=False, default=str)


def member_message_id(member: bytes) -> bytes:
    """The message id of a delayed-queue member (after its sort key: 14 characters whose
    first is g..v, or an earlier release's 16 hex ones), without importing the product's
    helper, so that ``--product`` may name an earlier tree."""
    return member[14:] if member[:1] >= b"g" else member[16:]
