"""Runs scenarios: starts the two servers, the worker fleet, the producer and the fault;
waits; stops everything by pid; analyses; renders the table."""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import redis

from .analysis import Stats, analyse, percentile
from .fault_common import FINISH, PRODUCER_DONE, READY, REFUSED, SENT, Record, records_key
from .periodic import PERIODIC_SCENARIOS, PeriodicScenario, run_periodic_scenario
from .procs import (
    DEFAULT_PRODUCT_ROOT,
    ValkeyProcess,
    WorkerCommand,
    WorkerFleet,
    binary_version,
    python_module_argv,
    start_server,
    subprocess_env,
)
from .scenarios import BASE_SERVER_CONFIG, SCENARIOS, SIZES, FaultContext, Scenario, Size, acl_rule

# The periodic actors' scenarios (periodic.py) run beside these, by the same commands.
SCENARIOS = {**SCENARIOS, **PERIODIC_SCENARIOS}

#: Longest delay the producer uses (ms); the last message is due at most this long
#: after the last send.
DELAY_MAX_MS = 5000
ACL_USER, ACL_PASSWORD = "app", "faults-pw"
_LOG_LEVEL = re.compile(r"\] \[(ERROR|CRITICAL)\] (.*)")


#: The brokers the suite can run: ours, and Dramatiq's built-in side by side (``--broker``).
BROKERS = ("redisson", "builtin")


@dataclass
class Result:
    scenario: str
    size: str
    stats: Stats
    failures: list[str]
    log_levels: dict[str, int] = field(default_factory=dict)
    log_samples: dict[str, int] = field(default_factory=dict)
    duration_s: float = 0.0
    workdir: str = ""
    broker: str = "redisson"

    @property
    def passed(self) -> bool:
        return not self.failures

    def as_json(self) -> dict[str, Any]:
        data = asdict(self)
        for samples in ("late_samples", "after_clear_samples"):
            data["stats"].pop(samples, None)  # thousands of numbers; the percentiles stay
        data["passed"] = self.passed
        return data


@contextlib.contextmanager
def record_server() -> Iterator[ValkeyProcess]:
    """The record server: no persistence, never faulted, stopped by pid at the end."""
    workdir = Path(tempfile.mkdtemp(prefix="faults-records-"))
    server = start_server("records", workdir, {"appendonly": "no"})
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(workdir, ignore_errors=True)


class RecordReader:
    """Reads a scenario's records incrementally (the list only grows)."""

    def __init__(self, url: str, prefix: str) -> None:
        self.client = redis.Redis.from_url(url)
        self.key = records_key(prefix)
        self.records: list[Record] = []
        self.finished: set[int] = set()
        self.sent: set[int] = set()
        self.refused: set[int] = set()
        self.ready = 0
        self.producer_done = False

    def poll(self) -> None:
        raw = self.client.lrange(self.key, len(self.records), -1)
        for item in raw:
            record = Record.parse(item)
            self.records.append(record)
            if record.kind == FINISH:
                self.finished.add(record.seq)
            elif record.kind == SENT:
                self.sent.add(record.seq)
            elif record.kind == REFUSED:
                self.refused.add(record.seq)
            elif record.kind == READY:
                self.ready += 1
            elif record.kind == PRODUCER_DONE:
                self.producer_done = True

    def complete(self) -> bool:
        return self.producer_done and self.sent <= (self.finished | self.refused)

    def now_ms(self) -> int:
        seconds, micros = self.client.time()
        return int(seconds) * 1000 + int(micros) // 1000

    def close(self) -> None:
        self.client.delete(self.key)
        self.client.close()


def _wait(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.1)


def _scan_logs(paths: list[Path]) -> tuple[dict[str, int], dict[str, int]]:
    """ERROR/CRITICAL line counts, and the most common such messages (digits masked)."""
    levels: Counter[str] = Counter()
    samples: Counter[str] = Counter()
    for path in paths:
        if not path.exists():
            continue
        for line in path.read_text(errors="replace").splitlines():
            match = _LOG_LEVEL.search(line)
            if match:
                levels[match.group(1)] += 1
                samples[f"{match.group(1)} {re.sub(r'[0-9a-f]{8,}|[0-9]+', '#', match.group(2))[:120]}"] += 1
            if "Consumer encountered" in line:
                levels["Consumer encountered"] += 1
    return dict(levels), dict(samples.most_common(8))


def check(scenario: Scenario, stats: Stats, size: Size | None = None) -> list[str]:
    """The scenario's pass/fail criteria, as failure messages (the lateness after the
    fault cleared is held to its bound at full size only: at small size one worker
    process restarts alone after a kill, and that boot is part of the figure)."""
    failures: list[str] = []
    c = scenario.criteria
    if stats.resume_samples:
        stats.notes["server accepting -> first run ms, p50/max"] = (
            f"{percentile(stats.resume_samples, 50):.0f}/{max(stats.resume_samples)}"
        )
    full = size is not None and size.name == "full"
    bound = c.max_late_after_clear_ms
    if full and bound is not None and (stats.after_clear_max or 0) > bound:
        failures.append(
            f"{sum(late > bound for late in stats.after_clear_samples)} messages ran more than {bound} ms "
            f"after the fault cleared (worst {stats.after_clear_max:.0f} ms)"
        )
    if full and c.max_resume_ms is not None and max(stats.resume_samples, default=0) > c.max_resume_ms:
        failures.append(
            f"delivery resumed more than {c.max_resume_ms} ms after the server accepted again "
            f"(worst {max(stats.resume_samples)} ms)"
        )
    if c.max_lost is not None and stats.lost > c.max_lost:
        failures.append(f"lost {stats.lost} > {c.max_lost} (e.g. seq {stats.lost_seqs[:10]})")
    if c.max_unexplained_dups is not None and stats.dup_unexplained > c.max_unexplained_dups:
        failures.append(
            f"unexplained duplicates {stats.dup_unexplained} > {c.max_unexplained_dups} "
            f"(e.g. seq {stats.dup_unexplained_seqs[:10]})"
        )
    if c.max_early is not None and stats.early > c.max_early:
        failures.append(f"early {stats.early} > {c.max_early} (worst {stats.early_worst_ms} ms)")
    if stats.recovery_samples:
        worst = max(stats.recovery_samples)
        stats.notes["held by a killed process: run again ms after the kill, p50/max"] = (
            f"{percentile(stats.recovery_samples, 50):.0f}/{worst}"
        )
        if c.max_recovery_ms is not None and worst > c.max_recovery_ms:
            failures.append(
                f"{sum(r > c.max_recovery_ms for r in stats.recovery_samples)} messages a killed process held "
                f"ran again more than {c.max_recovery_ms} ms after the kill (worst {worst} ms)"
            )
    if c.max_late_ms is not None:
        stranded = [late for late in stats.late_samples if late >= c.stranded_ms]
        too_late = sorted(late for late in stats.late_samples if c.max_late_ms < late < c.stranded_ms)
        stats.notes[f"later than {c.max_late_ms} ms"] = len(too_late)
        stats.notes["stranded by a kill (back after the heartbeat timeout)"] = len(stranded)
        if too_late:
            failures.append(
                f"{len(too_late)} scheduled messages later than {c.max_late_ms} ms (worst {too_late[-1]} ms)"
            )
    if "fault error" in stats.notes:
        failures.append(f"fault could not be injected: {stats.notes['fault error']}")
    if stats.sent == 0:
        failures.append("nothing was sent")
    return failures


def boot_fleet(
    app: str,
    scenario: Any,
    size: Size,
    env: dict[str, str],
    workdir: Path,
    reader: RecordReader,
    on_exit: Callable[[Any, int], None],
) -> WorkerFleet:
    """Start ``scenario``'s worker commands of ``python -m dramatiq <app>`` and wait until
    every process recorded that it is ready."""
    processes = scenario.processes or size.processes
    commands = scenario.commands or size.commands
    # --worker-fork-timeout: the dramatiq CLI waits for every worker process to say it booted
    # before it starts its fork processes (there are none here), for up to 30 s by default.
    # A worker killed while it boots (a kill9 scenario picks any child) never says so, and
    # the command then sat 30 s before it noticed the death and exited to be restarted: no
    # process of the fleet ran meanwhile, and recovery measured that stall of the CLI, not
    # the broker (one CI failure, 2026-11-28: a message ran again after 34 s).
    argv = python_module_argv(
        "dramatiq", app, "--processes", str(processes), "--threads", str(size.threads), "--worker-fork-timeout", "1000"
    )
    fleet = WorkerFleet(
        [WorkerCommand(i, argv, env, workdir, workdir / f"worker-{i}.log") for i in range(commands)],
        on_exit=on_exit,
    )
    fleet.start()
    expected = commands * processes

    def booted() -> bool:
        reader.poll()
        return reader.ready >= expected

    _wait(booted, 90, f"{expected} worker processes")
    return fleet


def inject_for(scenario: Any, ctx: FaultContext, seconds: float, reader: RecordReader) -> None:
    """Run the scenario's fault in a thread for ``seconds`` (reading records meanwhile),
    stop it, and bring the faulted server back if the fault left it down."""
    notes = ctx.notes

    def inject() -> None:
        try:
            scenario.fault(ctx)
        except Exception as e:  # noqa: BLE001 - reported as a failure of the scenario
            notes["fault error"] = f"{type(e).__name__}: {e}"

    fault_thread = threading.Thread(target=inject, name=f"fault-{scenario.name}", daemon=True)
    fault_thread.start()
    fault_stop_at = time.monotonic() + seconds
    while time.monotonic() < fault_stop_at and fault_thread.is_alive():
        reader.poll()
        time.sleep(0.2)
    ctx.stop.set()
    fault_thread.join(timeout=120)
    if fault_thread.is_alive():
        notes["fault error"] = "fault thread did not stop within 120 s"
    if ctx.server.pid is None:  # a fault left it down: bring it back for the drain
        ctx.server.start()
        notes["server restarted after fault"] = True


def prepare(scenario: Any, records: ValkeyProcess) -> tuple[float, Path, str, RecordReader, ValkeyProcess]:
    """A scenario's start time, working directory, record prefix, record reader and (not
    yet started) faulted server."""
    began = time.monotonic()
    workdir = Path(tempfile.mkdtemp(prefix=f"faults-{scenario.name}-"))
    prefix = f"run:{scenario.name}:{uuid.uuid4().hex[:8]}"
    reader = RecordReader(records.url, prefix)
    server = ValkeyProcess("faulted", workdir / "faulted", {**BASE_SERVER_CONFIG, **scenario.server_config})
    return began, workdir, prefix, reader, server


def stop_fleet(fleet: WorkerFleet, exits: list[int], notes: dict[str, Any]) -> None:
    """Stop the workers; note odd exit codes and how often a worker command restarted."""
    codes = fleet.stop()
    if any(code not in (0, None) for code in codes):
        notes["worker exit codes at stop"] = codes
    if exits:
        notes["worker command restarts"] = len(exits)


def stamped(result: Result, began: float, workdir: Path) -> Result:
    """``result`` with its duration (since ``began``, monotonic) and working directory."""
    result.duration_s = round(time.monotonic() - began, 1)
    result.workdir = str(workdir)
    return result


def start_faulted(server: ValkeyProcess, workdir: Path) -> ValkeyProcess:
    """Start the faulted server; if the probed port was taken meanwhile, one more try on
    another. Returns the server that runs."""
    try:
        server.start()
    except RuntimeError:
        server = ValkeyProcess("faulted", workdir / "faulted2", server.config)
        server.start()
    return server


def _slots_in_use(server: ValkeyProcess) -> int | str:
    """The fault queue's slots in use (flow control), read on the faulted server."""
    from dramatiq_redisson._keys import QueueKeys

    try:
        client = redis.Redis(host="127.0.0.1", port=server.port, socket_timeout=5)
        try:
            return int(client.hget(QueueKeys("dramatiq", "faults").flow, "inuse") or 0)
        finally:
            client.close()
    except redis.RedisError as e:
        return f"unknown ({type(e).__name__})"


def run_scenario(
    scenario: Scenario,
    size: Size,
    records: ValkeyProcess,
    product_root: Path = DEFAULT_PRODUCT_ROOT,
    broker: str = "redisson",
    flow: bool = False,
) -> Result:
    """One scenario on a fresh faulted server and fresh record keys, with our broker or
    (``broker="builtin"``) Dramatiq's RedisBroker. ``flow``: with flow control on (groups,
    priorities, a queue and a group concurrency limit; ``fault_app.FLOW``): every slot
    must be back once every message ran and the workers stopped."""
    if broker not in BROKERS or (broker == "builtin" and not scenario.builtin):
        raise ValueError(f"scenario {scenario.name!r} cannot run with broker {broker!r}")
    if flow and (broker != "redisson" or isinstance(scenario, PeriodicScenario)):
        raise ValueError(f"scenario {scenario.name!r} cannot run with flow control on broker {broker!r}")
    if isinstance(scenario, PeriodicScenario):
        return run_periodic_scenario(scenario, size, records, product_root)
    began, workdir, prefix, reader, server = prepare(scenario, records)
    fleet: WorkerFleet | None = None
    producer: subprocess.Popen[bytes] | None = None
    producer_log = open(workdir / "producer.log", "wb")  # noqa: SIM115 - closed below
    stop = threading.Event()
    notes: dict[str, Any] = {}
    interrupted = False
    try:
        server = start_faulted(server, workdir)
        broker_url = server.url
        if scenario.acl_user:
            rule, source = acl_rule(product_root, binary_version())
            admin = redis.Redis(host="127.0.0.1", port=server.port)
            admin.execute_command("ACL", "SETUSER", ACL_USER, "reset", "on", f">{ACL_PASSWORD}", *rule.split())
            admin.close()
            broker_url = f"redis://{ACL_USER}:{ACL_PASSWORD}@127.0.0.1:{server.port}/0"
            notes["acl rule"] = source
        env = subprocess_env(
            product_root,
            {
                "FAULTS_BROKER_URL": broker_url,
                "FAULTS_RECORD_URL": records.url,
                "FAULTS_PREFIX": prefix,
                "FAULTS_QUEUE": "faults",
                "FAULTS_N": str(size.messages),
                "FAULTS_RATE": str(size.rate),
                "FAULTS_DELAY_MAX_MS": str(DELAY_MAX_MS),
                "FAULTS_BROKER": broker,
                **({"FAULTS_FLOW": "1"} if flow else {}),
            },
        )
        if flow:
            notes["flow"] = "8 groups, priorities 0-3, concurrency 6, 1 per group, 40/s per group"
        exits: list[int] = []

        def on_exit(command: WorkerCommand, code: int) -> None:
            exits.append(code)

        fleet = boot_fleet("fault_app:broker", scenario, size, env, workdir, reader, on_exit)

        ctx = FaultContext(server=server, fleet=fleet, size=size, stop=stop, clock=reader.now_ms, notes=notes)
        producer = subprocess.Popen(
            python_module_argv("fault_producer"), env=env, cwd=workdir, stdout=producer_log, stderr=producer_log
        )
        inject_for(scenario, ctx, size.messages / size.rate + DELAY_MAX_MS / 1000, reader)
        fault_end = time.monotonic()
        settle_until = fault_end + scenario.settle_s
        deadline = fault_end + size.grace_s + scenario.settle_s
        while time.monotonic() < deadline:
            reader.poll()
            if reader.complete() and time.monotonic() >= settle_until:
                break
            time.sleep(0.2)
        else:
            notes["waited to deadline"] = True
        if producer.poll() is None:
            notes["producer unfinished"] = True
        stop_fleet(fleet, exits, notes)
        reader.poll()
        if flow:
            notes["slots in use at the end"] = _slots_in_use(server)
        # For a later look at a failed (or --keep) scenario: every record and injection.
        with open(workdir / "records.txt", "w") as out:
            out.writelines(f"{r.kind}|{r.seq}|{r.attempt}|{r.pid}|{r.extra}|{r.ms}\n" for r in reader.records)
            out.writelines(f"event|{e!r}\n" for e in ctx.events)
        stats = analyse(reader.records, ctx.events)
        stats.notes = {**notes, **stats.notes}
        levels, samples = _scan_logs([command.log_path for command in fleet.commands])
        failures = check(scenario, stats, size)
        if flow and reader.complete() and notes["slots in use at the end"] != 0:
            failures.append(f"slots leaked: {notes['slots in use at the end']} in use once every message ran")
        if broker == "builtin":
            # Dramatiq's broker beside ours: its misses are figures, not failures of ours.
            if stats.lost:
                stats.notes["not run by the end of the wait"] = stats.lost
            if failures:
                stats.notes["our criteria (not enforced)"] = "; ".join(failures)
            failures = []
        return stamped(
            Result(scenario.name, size.name, stats, failures, levels, samples, broker=broker), began, workdir
        )
    except KeyboardInterrupt:
        interrupted = True
        raise
    finally:
        stop.set()
        if producer is not None and producer.poll() is None:
            producer.kill()
            producer.wait()
        producer_log.close()
        if fleet is not None:
            fleet.stop()
        server.stop()
        reader.close()
        if interrupted:  # nobody will look at a half-run scenario's files
            shutil.rmtree(workdir, ignore_errors=True)


def run(
    names: list[str],
    size: Size,
    product_root: Path,
    keep: bool = False,
    brokers: tuple[str, ...] = ("redisson",),
    flow: bool = False,
) -> list[Result]:
    """Each scenario with each broker (the built-in only where it applies), in turn;
    ``flow``: ours with flow control on (see :func:`run_scenario`)."""
    results: list[Result] = []
    with record_server() as records:
        for name, broker in [(n, b) for n in names for b in brokers if b != "builtin" or SCENARIOS[n].builtin]:
            print(f"[faults] {name} ({size.name}, {broker}) ...", file=sys.stderr, flush=True)
            try:
                result = run_scenario(
                    SCENARIOS[name], size, records, product_root, broker, flow and broker == "redisson"
                )
            except Exception as e:  # noqa: BLE001 - one broken scenario must not hide the others' rows
                stats = Stats()
                stats.notes["crashed"] = f"{type(e).__name__}: {e}"
                result = Result(name, size.name, stats, [f"scenario crashed: {type(e).__name__}: {e}"], broker=broker)
            verdict = "PASS" if result.passed else "FAIL: " + "; ".join(result.failures)
            if broker == "builtin":
                verdict = "reported"
            print(f"[faults] {name}: {verdict} ({result.duration_s} s, {result.workdir})", file=sys.stderr, flush=True)
            if result.passed and not keep:
                shutil.rmtree(result.workdir, ignore_errors=True)
            results.append(result)
    return results


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def markdown(results: list[Result]) -> str:
    header = (
        "| fault | sent | refused | lost | dup expl. | dup unexpl. | early | late p50/p99/max ms "
        "| ready late p50/max ms | late after the fault cleared p99/max ms "
        "| worker ERROR/CRIT (consumer restarts) | notes | verdict |"
    )
    lines = [header, "|" + "---|" * 13]
    for r in results:
        s = r.stats
        notes = dict(s.notes)
        if s.refused_ran:
            notes["refused but ran"] = s.refused_ran
        if s.unfinished_runs:
            notes["runs never ended"] = s.unfinished_runs
        note_text = "; ".join(f"{k}: {v}" for k, v in notes.items()).replace("|", "/")
        verdict = "reported" if r.broker == "builtin" else "PASS" if r.passed else "**FAIL**"
        fault = r.scenario if r.broker == "redisson" else f"{r.scenario} (built-in)"
        lines.append(
            f"| {fault} | {s.sent} | {s.refused} | {s.lost} | {s.dup_explained} | {s.dup_unexplained} "
            f"| {s.early} | {_ms(s.late_p50)}/{_ms(s.late_p99)}/{_ms(s.late_max)} "
            f"| {_ms(s.ready_p50)}/{_ms(s.ready_max)} | {_ms(s.after_clear_p99)}/{_ms(s.after_clear_max)} "
            f"| {r.log_levels.get('ERROR', 0)}/{r.log_levels.get('CRITICAL', 0)} "
            f"({r.log_levels.get('Consumer encountered', 0)}) | {note_text} | {verdict} |"
        )
    products = sorted({p for r in results for p in r.stats.products})
    lines += ["", f"Workers imported dramatiq_redisson from: {', '.join(products) or 'unknown'}"]
    logged = [r for r in results if r.log_samples]
    if logged:
        lines += ["", "Most frequent worker ERROR/CRITICAL lines (digits and hex masked as #):", ""]
        for r in logged:
            for text, count in r.log_samples.items():
                lines.append(f"- {r.scenario}: {count} × `{text}`")
    failed = [r for r in results if r.failures]
    if failed:
        lines += ["", "Failures:", ""]
        lines += [f"- {r.scenario}: {'; '.join(r.failures)}" for r in failed]
    return "\n".join(lines)


def from_json(text: str) -> list[Result]:
    """Results read back from :func:`as_json` (to render a saved run again)."""
    results = []
    for item in json.loads(text):
        item.pop("passed", None)
        item["stats"] = Stats(**item["stats"])
        results.append(Result(**item))
    return results


def as_json(results: list[Result]) -> str:
    return json.dumps([r.as_json() for r in results], indent=2)


__all__ = [
    "BROKERS",
    "SCENARIOS",
    "SIZES",
    "Result",
    "as_json",
    "from_json",
    "markdown",
    "record_server",
    "run",
    "run_scenario",
]
