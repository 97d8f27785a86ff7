"""Shared plumbing: sizes, the server, brokers, worker processes, records, statistics."""

from __future__ import annotations

import json
import logging
import multiprocessing as mp
import os
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import redis

from ._measure import script_sha
from ._server import Server

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


# -- brokers ----------------------------------------------------------------------------


def add_tracing(broker: Any) -> bool:
    """Add ``dramatiq_redisson.tracing.OpenTelemetry`` to ``broker`` with OpenTelemetry's
    global tracer provider, which nothing here configures: the API's no-op, what an app
    without an SDK pays (the ``*-otel`` scenarios). False when the product has no such
    module (a ref from before it) or ``opentelemetry-api`` is missing: the run goes on
    without it, and says so in its JSON (``otel``)."""
    import dramatiq_redisson

    try:
        from dramatiq_redisson import tracing
    except ImportError:
        return False
    # The venv's editable install answers a submodule the product lacks with this
    # checkout's: only the product's own module counts.
    if Path(tracing.__file__).resolve().parent != Path(dramatiq_redisson.__file__).resolve().parent:
        return False
    broker.add_middleware(tracing.OpenTelemetry())
    return True


def make_broker(kind: str, url: str, **options: Any) -> Any:
    """A broker of one kind, instrumented so that the server-computed due time of the last
    single offer is readable (``broker.bench_last_dues``; also when the offer raised
    ``NotReplicated``: the write is on the primary). ``options`` go to ``RedissonBroker``
    (``cluster=True``, ``wait_for_replicas``…)."""
    if kind == "builtin":
        from dramatiq.brokers.redis import RedisBroker

        return RedisBroker(url=url, namespace=NAMESPACE, **options)
    if kind == "redisson":
        from dramatiq_redisson import RedissonBroker

        broker: Any = RedissonBroker(url=url, namespace=NAMESPACE, **options)
    elif kind == "redisson-lrem":
        from ._lrem import LremRedissonBroker

        broker = LremRedissonBroker(url=url, namespace=NAMESPACE, **options)
    else:
        raise ValueError(f"unknown broker kind {kind!r} (choose from {', '.join(BROKER_KINDS)})")
    try:
        from dramatiq_redisson import NotReplicated
    except ImportError:  # a product from before it (8d27b2a, measured with --product)

        class NotReplicated(Exception):  # type: ignore[no-redef]  # nothing raises it there
            pass

    scripts = broker.redisson_scripts
    original_offer = scripts.offer

    def offer(keys: Any, entries: Any, *, client: Any = None, **options: Any) -> Any:
        try:
            result = original_offer(keys, entries, client=client, **options)
        except NotReplicated as e:
            if client is None:
                broker.bench_last_dues = getattr(e, "reply", None)
            raise
        if client is None:
            broker.bench_last_dues = result
        return result

    scripts.offer = offer
    if hasattr(scripts, "offer_one"):  # the one-message offer (releases after 2026-11-25)
        original_one = scripts.offer_one

        def offer_one(*args: Any, **options: Any) -> Any:
            try:
                due = original_one(*args, **options)
            except NotReplicated as e:
                broker.bench_last_dues = [getattr(e, "reply", None)]
                raise
            broker.bench_last_dues = [due]
            return due

        scripts.offer_one = offer_one
    return broker


def script_names(broker: Any) -> dict[str, str]:
    """sha -> name of every script the broker (and the harness) runs."""
    from . import _actor

    names = {script_sha(_actor.RECORD_LUA): "recorder"}
    try:
        names[script_sha(reference_lua())] = "reference-transfer"
    except ImportError:  # a product from before lua includes (8d27b2a, with --product): no such variant
        pass
    if hasattr(broker, "redisson_scripts"):
        for name, script in broker.redisson_scripts._s.items():
            names[script.sha] = name
    if hasattr(broker, "scripts"):
        for name, script in broker.scripts.items():
            names[script.sha] = name
    return names


def reference_lua() -> bytes:
    from dramatiq_redisson.scripts._runner import expand_includes

    return expand_includes((HERE / "redisson_original_transfer.lua").read_bytes())


def due_of(broker: Any, kind: str, message: Any) -> float:
    """The due time (epoch ms) of a message just offered one by one."""
    if kind == "builtin":
        return float(message.options["eta"])  # producer clock == server clock (same host)
    return float(broker.bench_last_dues[0])  # computed by offer.lua from the server's TIME


def member_message_id(member: bytes) -> bytes:
    """The message id of a delayed-queue member (after its sort key: 14 characters whose
    first is g..v, or an earlier release's 16 hex ones), without importing the product's
    helper, so that ``--product`` may name an earlier tree."""
    return member[14:] if member[:1] >= b"g" else member[16:]


def queue_keys(kind: str) -> Any:
    from dramatiq_redisson import QueueKeys

    return QueueKeys(NAMESPACE, QUEUE)


def bulk_offer(
    broker: Any,
    kind: str,
    actor: Any,
    seqs: Sequence[int],
    delay_ms: int,
    chunk: int = 10_000,
    read_dues: bool = False,
    server: Server | None = None,
) -> dict[int, float]:
    """Offer delayed messages in bulk: ``enqueue_many`` for the Redisson brokers; for the
    built-in broker, the same ``dispatch.lua`` "enqueue" call that ``RedisBroker.enqueue``
    makes, pipelined, with one eta for all. Returns seq -> due ms when ``read_dues``."""
    dues: dict[int, float] = {}
    if kind == "builtin":
        from dramatiq.common import current_millis, dq_name

        broker._max_unpack_size()
        dispatch = broker.scripts["dispatch"]
        eta = current_millis() + delay_ms
        dq = dq_name(QUEUE)
        for start in range(0, len(seqs), chunk):
            with broker.client.pipeline(transaction=False) as pipe:
                for seq in seqs[start : start + chunk]:
                    m = actor.message(seq)
                    m = m.copy(queue_name=dq, options={"redis_message_id": str(uuid.uuid4()), "eta": eta})
                    args = [
                        "enqueue",
                        current_millis(),
                        dq,
                        broker.broker_id,
                        broker.heartbeat_timeout,
                        broker.dead_message_ttl,
                        0,
                        broker._max_unpack_size(),
                        m.options["redis_message_id"],
                        m.encode(),
                    ]
                    dispatch(keys=[broker.namespace], args=args, client=pipe)
                    if read_dues:
                        dues[seq] = float(eta)
                pipe.execute()
        return dues
    keys = broker.keys(QUEUE)
    before = server.now_ms() if (read_dues and server) else None
    for start in range(0, len(seqs), chunk):
        part = seqs[start : start + chunk]
        messages = broker.enqueue_many([actor.message(seq) for seq in part], delay=delay_ms)
        if read_dues:
            with broker.client.pipeline(transaction=False) as pipe:
                for m in messages:
                    pipe.zscore(keys.timeout_zset, m.options["redis_message_id"])
                scores = pipe.execute()
            for seq, score in zip(part, scores, strict=False):
                # An entry that already moved lost its score: fall back to a lower bound.
                dues[seq] = float(score) if score is not None else float((before or 0) + delay_ms)
    return dues


# -- the product under test -------------------------------------------------------------


def use_product(root: Path) -> str:
    """Make this process and every process it spawns import ``dramatiq_redisson`` from
    ``root`` (e.g. a ``git worktree`` frozen at the commit to measure). A temporary
    directory holding only a link to ``root/dramatiq_redisson`` goes first on ``sys.path``
    (``root`` itself would also shadow this ``benchmarks`` package with its own copy),
    ahead of the current directory and of the venv's editable install, whose finder only
    answers what ``sys.path`` does not; and first on ``PYTHONPATH``. Spawned workers get
    this ``sys.path`` from multiprocessing. Returns the file imported."""
    import atexit
    import shutil
    import sys
    import tempfile

    root = root.resolve()
    if not (root / "dramatiq_redisson" / "__init__.py").is_file():
        raise ValueError(f"{root} has no dramatiq_redisson package")
    if "dramatiq_redisson" in sys.modules:
        raise RuntimeError("dramatiq_redisson was imported before --product could take effect")
    shadow = Path(tempfile.mkdtemp(prefix="bench-product-"))
    atexit.register(shutil.rmtree, shadow, ignore_errors=True)
    (shadow / "dramatiq_redisson").symlink_to(root / "dramatiq_redisson", target_is_directory=True)
    sys.path.insert(0, str(shadow))
    os.environ["PYTHONPATH"] = os.pathsep.join([str(shadow), *filter(None, [os.environ.get("PYTHONPATH")])])
    origin = product_origin()
    if origin is None or root not in Path(origin).resolve().parents:
        raise RuntimeError(f"dramatiq_redisson still comes from {origin}, not from {root}")
    return origin


def product_origin() -> str | None:
    """The file ``dramatiq_redisson`` is (or would be) imported from in this process."""
    import importlib.util
    import sys

    module = sys.modules.get("dramatiq_redisson")
    origin = module.__file__ if module is not None else None
    if origin is None:
        spec = importlib.util.find_spec("dramatiq_redisson")
        origin = spec.origin if spec is not None else None
    return str(Path(origin).resolve()) if origin else None


# -- commands sent, counted by the client ------------------------------------------------


# -- worker processes -----------------------------------------------------------------


class Workers:
    """``procs`` child processes (multiprocessing spawn), each running a Dramatiq
    ``Worker`` with ``threads`` threads in-process. ``mode="move"`` runs workers that only
    move delayed messages to the ready queue and never run them (burst scenario).

    With ``count_slots`` (see :func:`counter_slots`), every process counts the commands it
    sends into a shared array; :meth:`command_counts` sums them. ``options``: the broker's
    keyword arguments, the queues to consume and where the records go (see
    ``_child.worker_main``). Every process reports
    where it imports ``dramatiq_redisson`` from, and must agree with this process."""

    def __init__(
        self,
        kind: str,
        url: str,
        procs: int,
        threads: int,
        mode: str = "run",
        count_slots: Sequence[str] | None = None,
        options: dict[str, Any] | None = None,
    ) -> None:
        self.kind, self.url, self.procs, self.threads, self.mode = kind, url, procs, threads, mode
        self.options = options
        self.ctx = mp.get_context("spawn")
        self.processes: list[Any] = []
        self.crashed: list[str] = []
        self.count_slots = list(count_slots) if count_slots else None
        self.counts: Any = None
        self.product: str | None = None

    def __enter__(self) -> Workers:
        from ._child import worker_main

        self.stop_event = self.ctx.Event()
        self.ready = self.ctx.Queue()
        width = len(self.count_slots) if self.count_slots else 0
        if self.count_slots:
            self.counts = self.ctx.RawArray("q", self.procs * width)
        for i in range(self.procs):
            count = (self.counts, i * width, self.count_slots) if self.count_slots else None
            p = self.ctx.Process(
                target=worker_main,
                args=(self.kind, self.url, self.threads, self.mode, self.ready, self.stop_event, count, self.options),
                daemon=True,
            )
            p.start()
            self.processes.append(p)
        deadline = time.monotonic() + 120
        ready = 0
        expected = product_origin()
        try:
            while ready < self.procs:
                if time.monotonic() > deadline:
                    raise RuntimeError("worker processes did not start within 120 s")
                for p in self.processes:
                    if not p.is_alive():
                        raise RuntimeError(f"worker process {p.pid} died at start (exit code {p.exitcode})")
                try:
                    pid, origin = self.ready.get(timeout=0.5)
                except Exception:
                    continue
                ready += 1
                if origin != expected:
                    raise RuntimeError(
                        f"worker process {pid} imports dramatiq_redisson from {origin}, the harness from {expected}"
                    )
                self.product = origin
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def command_counts(self) -> dict[str, int]:
        """Commands sent so far by all the processes, per counter slot."""
        if not self.count_slots:
            return {}
        width = len(self.count_slots)
        raw = list(self.counts)
        return {name: sum(raw[p * width + i] for p in range(self.procs)) for i, name in enumerate(self.count_slots)}

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.processes]

    def rss(self) -> list[int]:
        import psutil

        return [psutil.Process(pid).memory_info().rss for pid in self.pids]

    def check(self) -> None:
        for p in self.processes:
            if not p.is_alive():
                raise RuntimeError(f"worker process {p.pid} died (exit code {p.exitcode})")

    def __exit__(self, *exc: Any) -> None:
        self.stop_event.set()
        deadline = time.monotonic() + 30
        for p in self.processes:
            p.join(max(0.1, deadline - time.monotonic()))
        for p in self.processes:
            if p.is_alive():
                self.crashed.append(f"worker process {p.pid} did not stop within 30 s; killed")
                p.terminate()
                p.join(5)
                if p.is_alive():
                    p.kill()
                    p.join(5)
            elif p.exitcode not in (0, None):
                self.crashed.append(f"worker process {p.pid} exited with code {p.exitcode}")
        self.ready.close()


# -- records --------------------------------------------------------------------------


def dumps(obj: Any) -> str:
    return json.dumps(obj, indent=1, sort_keys=False, default=str)


def machine_info(server: Server, product_root: Path | None = None) -> dict[str, Any]:
    """The machine, the versions, and git commits (``+dirty``: uncommitted changes): ``git``,
    the product measured (``product_root`` when given, else this checkout's
    ``dramatiq_redisson``); ``harness_git``, this checkout's ``benchmarks``."""
    import platform
    import subprocess

    import dramatiq

    model = ""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        for line in out.splitlines():
            if line.startswith("Model name"):
                model = line.split(":", 1)[1].strip()
    except Exception:
        pass

    def git(root: Path, path: str) -> str:
        try:
            rev = subprocess.run(
                ["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10
            ).stdout.strip()
            dirty = subprocess.run(
                ["git", "-C", str(root), "status", "--porcelain", "--", path],
                capture_output=True,
                text=True,
                timeout=10,
            ).stdout.strip()
            return rev + ("+dirty" if dirty else "")
        except Exception:
            return ""

    return {
        "git": git(product_root or HERE.parent, "dramatiq_redisson"),
        "harness_git": git(HERE.parent, "benchmarks"),
        "nproc": os.cpu_count(),
        "cpu_model": model,
        "python": platform.python_version(),
        "server": server.version(),
        "dramatiq": dramatiq.__version__,
        "redis_py": redis.__version__,
        "platform": platform.platform(),
        "loadavg_at_start": os.getloadavg(),
    }
