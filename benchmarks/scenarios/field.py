"""``field`` (issue 55): one delayed workload on five job queues, one after another on the
same server (emptied between them): ``redisson`` (``RedissonBroker``), ``builtin``
(Dramatiq's ``RedisBroker``), ``celery`` (Celery on its Redis broker), ``huey``
(``RedisHuey``) and ``rq``. Per system: how late its delayed jobs start, what each job
costs the server (CPU, commands), and the server memory a job scheduled an hour ahead
takes. A peer that does not import is skipped with a row that says so; ``field`` is not
part of ``all`` (the peers are the ``field`` extra, which CI does not install).

How each is driven (``python -m benchmarks field --size full``):

- workload: ``n`` jobs offered one by one at ``rate``/s by one producer (this process),
  each delayed uniformly ``delay_lo``–``delay_hi`` ms (the same delays for every system),
  a no-op job that records its start;
- workers: ``procs`` processes × ``threads`` threads. Ours and built-in: the harness's
  Dramatiq ``Worker`` processes. Celery: ``celery worker --pool threads --concurrency
  threads``, one per process (ETA jobs wait in the worker's memory, as Celery does).
  huey: ``huey_consumer -k thread -w threads``, one per process (each consumer's
  scheduler polls the schedule once a second). rq: ``rq_procs`` ``rq worker
  --with-scheduler`` processes (an rq worker runs one job at a time, in a fork; one of
  them holds the scheduler lock and moves due jobs every second);
- delays: ``send_with_options(delay=…)``, ``apply_async(countdown=…)``,
  ``schedule(delay=…)``, ``enqueue_in(timedelta(…))``;
- records: every job runs the harness's recorder (server ``TIME``, ``RPUSH``) on a
  second embedded Valkey, never on the server under test; due = the send time on this
  process's clock + the delay (ours: the due time ``offer.lua`` computed, built-in: the
  message's ``eta``), so lateness = start − due, on the same host's clock;
- server cost, over the window from the first send to the last record, per job: CPU
  (``used_cpu_sys`` + ``used_cpu_user``: commands, I/O, idle polling, everything) and
  commands (``INFO commandstats``: every command, those run inside scripts included,
  the script calls themselves and the harness's ``INFO``/``CONFIG``/``SLOWLOG`` not; as
  ``_measure.server_work`` counts, but for connection set-up and ``PING``, which count
  here: see ``CONNECTION_COMMANDS``);
- memory, workers stopped: ``scheduled`` jobs an hour out, in bulk where the library has
  a way (ours ``enqueue_many``; built-in the pipelined ``enqueue`` call, as the
  ``memory`` scenario; rq ``enqueue_at`` on a pipeline, 1 000 a round trip), one by one
  where it has none (Celery, huey); bytes per job = the ``used_memory`` delta / n.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import redis

from .. import _field_peers as peers
from .._base import HERE, HOUR_MS, QUEUE
from .._brokers import bulk_offer, due_of
from .._measure import REC_KEY, analyze, read_records
from .._server import Server
from .._workers import Workers
from ._shared import Ctx, _ratio

SYSTEMS = ("redisson", "builtin", "celery", "huey", "rq")
PEERS = ("celery", "huey", "rq")
#: Not counted as a system's commands: what the harness sends the server under test
#: during a window (``INFO``, ``CONFIG RESETSTAT``, ``SLOWLOG RESET``), and script calls,
#: whose commands count by name (Valkey counts a command run inside a script as its own).
NOT_COUNTED = ("info", "config", "slowlog", "eval", "evalsha", "fcall", "fcall_ro")
#: Connection set-up and health checks. ``_measure.server_work`` leaves them out with the
#: harness's own; here the harness opens no connection to the server under test during a
#: window, so they are the systems' (an rq work horse connects anew for every job) and
#: count, and are also shown apart in the JSON.
CONNECTION_COMMANDS = ("client", "hello", "ping", "command", "script", "auth", "select")
ROOT = HERE.parent


class _System:
    """One job queue under test: its workers, and a producer in this process."""

    name = ""

    def missing(self) -> str | None:
        """Why this system cannot run here (a library not installed), or None."""
        return None

    def workers_text(self, p: dict[str, Any]) -> str:
        return f"{p['procs']} proc x {p['threads']} threads"

    def workers(self, ctx: Ctx, p: dict[str, Any], record_url: str) -> Any:
        """A context manager: the worker processes, started and ready; ``.check()`` raises
        if one died, ``.crashed`` lists what went wrong when they stopped."""
        raise NotImplementedError

    def open(self, url: str) -> None:
        """Make the producer (this process)."""
        raise NotImplementedError

    def send(self, seq: int, delay_ms: int) -> float:
        """Send job ``seq`` delayed ``delay_ms``; its due time (epoch ms)."""
        raise NotImplementedError

    def schedule_far(self, seqs: list[int]) -> None:
        """Schedule these jobs an hour out, in bulk where the library has a way."""
        raise NotImplementedError

    def close(self) -> None:
        pass


class _Dramatiq(_System):
    """Ours or the built-in broker, as the harness makes and runs them elsewhere."""

    def __init__(self, kind: str, ctx: Ctx) -> None:
        self.name, self.ctx = kind, ctx

    def workers(self, ctx: Ctx, p: dict[str, Any], record_url: str) -> Any:
        return Workers(self.name, ctx.server.url, p["procs"], p["threads"], options={"record_url": record_url})

    def open(self, url: str) -> None:
        self.broker, self.actor = self.ctx.producer(self.name)

    def send(self, seq: int, delay_ms: int) -> float:
        m = self.actor.send_with_options(args=(seq,), delay=delay_ms)
        return due_of(self.broker, self.name, m)

    def schedule_far(self, seqs: list[int]) -> None:
        bulk_offer(self.broker, self.name, self.actor, seqs, HOUR_MS)

    def close(self) -> None:
        self.broker.close()


def _missing(*modules: str) -> str | None:
    import importlib

    for module in modules:
        try:
            importlib.import_module(module)
        except ImportError as e:
            return f"{module} does not import ({e}); pip install -e '.[field]'"
    return None


class _Peer(_System):
    """A peer: worker processes started as its documentation starts them."""

    def commands(self, p: dict[str, Any], url: str) -> list[list[str]]:
        raise NotImplementedError

    def ready(self, server: redis.Redis, record: redis.Redis, p: dict[str, Any]) -> bool:
        """Every worker process is up (before the warm-up job)."""
        return bool(len(set(record.lrange(peers.READY_KEY, 0, -1))) >= p["procs"])

    def workers(self, ctx: Ctx, p: dict[str, Any], record_url: str) -> Any:
        record = redis.Redis.from_url(record_url)
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]),
            "PYTHONUNBUFFERED": "1",
            peers.URL_ENV: ctx.server.url,
            peers.RECORD_URL_ENV: record_url,
        }
        return _PeerProcesses(
            self.name, self.commands(p, ctx.server.url), env, lambda: self.ready(ctx.r, record, p), ctx.log
        )


class _Celery(_Peer):
    name = "celery"

    def missing(self) -> str | None:
        return _missing("celery", "kombu.transport.redis")

    def workers_text(self, p: dict[str, Any]) -> str:
        return f"{p['procs']} proc x {p['threads']} threads (--pool threads)"

    def commands(self, p: dict[str, Any], url: str) -> list[list[str]]:
        return [
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "benchmarks._field_peers:celery_app",
                "worker",
                "--pool",
                "threads",
                "--concurrency",
                str(p["threads"]),
                "--hostname",
                f"bench{i}@%h",
                "--queues",
                QUEUE,
                "--loglevel",
                "WARNING",
            ]
            for i in range(p["procs"])
        ]

    def open(self, url: str) -> None:
        self.app, self.task = peers.make_celery(url)

    def send(self, seq: int, delay_ms: int) -> float:
        sent = time.time() * 1000
        self.task.apply_async(args=(seq,), countdown=delay_ms / 1000)
        return sent + delay_ms

    def schedule_far(self, seqs: list[int]) -> None:
        for seq in seqs:  # Celery has no bulk send
            self.task.apply_async(args=(seq,), countdown=HOUR_MS / 1000)

    def close(self) -> None:
        self.app.close()


class _Huey(_Peer):
    name = "huey"

    def missing(self) -> str | None:
        return _missing("huey")

    def workers_text(self, p: dict[str, Any]) -> str:
        return f"{p['procs']} proc x {p['threads']} threads (-k thread)"

    def commands(self, p: dict[str, Any], url: str) -> list[list[str]]:
        consumer = [sys.executable, "-m", "huey.bin.huey_consumer", "benchmarks._field_peers.huey_app"]
        return [[*consumer, "--workers", str(p["threads"]), "--worker-type", "thread", "--quiet"]] * p["procs"]

    def open(self, url: str) -> None:
        self.huey, self.task = peers.make_huey(url)

    def send(self, seq: int, delay_ms: int) -> float:
        sent = time.time() * 1000
        self.task.schedule(args=(seq,), delay=delay_ms / 1000)
        return sent + delay_ms

    def schedule_far(self, seqs: list[int]) -> None:
        for seq in seqs:  # huey has no bulk schedule
            self.task.schedule(args=(seq,), delay=HOUR_MS / 1000)

    def close(self) -> None:
        self.huey.storage.pool.disconnect()


class _Rq(_Peer):
    name = "rq"

    def missing(self) -> str | None:
        return _missing("rq")

    def workers_text(self, p: dict[str, Any]) -> str:
        return f"{p['rq_procs']} proc x 1 (fork per job)"

    def commands(self, p: dict[str, Any], url: str) -> list[list[str]]:
        # rq's CLI behind a line that imports the job's module first, as rq's performance
        # notes advise: each work horse is a fork of its worker and finds the module (and
        # what it imports) loaded, instead of importing it for every job.
        preload = f"import {peers.__name__}; from rq.cli import main; main()"
        worker = [sys.executable, "-c", preload, "worker", "--url", url, "--with-scheduler", "--quiet"]
        return [[*worker, "--name", f"bench{i}", QUEUE] for i in range(p["rq_procs"])]

    def ready(self, server: redis.Redis, record: redis.Redis, p: dict[str, Any]) -> bool:
        # Every worker registered, and one of them took the queue's scheduler lock.
        return bool(server.scard("rq:workers") >= p["rq_procs"] and server.exists(f"rq:scheduler-lock:{QUEUE}"))

    def open(self, url: str) -> None:
        from rq import Queue

        self.client = redis.Redis.from_url(url)
        self.queue = Queue(QUEUE, connection=self.client)

    def send(self, seq: int, delay_ms: int) -> float:
        sent = time.time() * 1000
        self.queue.enqueue_in(timedelta(milliseconds=delay_ms), peers.rq_record, seq)
        return sent + delay_ms

    def schedule_far(self, seqs: list[int]) -> None:
        when = datetime.now(timezone.utc) + timedelta(milliseconds=HOUR_MS)
        for start in range(0, len(seqs), 1000):
            with self.client.pipeline() as pipe:
                for seq in seqs[start : start + 1000]:
                    self.queue.enqueue_at(when, peers.rq_record, seq, pipeline=pipe)
                pipe.execute()

    def close(self) -> None:
        self.client.close()


class _PeerProcesses:
    """A peer's worker processes: one ``subprocess`` per command, each in a session of its
    own (a Ctrl-C at the terminal reaches the harness, which stops them), output to a
    log file. Ready when ``ready()`` says so (60 s at most). Stopped with SIGTERM (a warm
    shutdown for Celery and rq, an immediate one for huey: every job has run by then),
    then SIGKILL after 30 s; the processes they started (rq's work horses and scheduler)
    are looked up by pid and killed if any outlive them."""

    def __init__(
        self,
        name: str,
        commands: list[list[str]],
        env: dict[str, str],
        ready: Callable[[], bool],
        log: Callable[[str], None],
    ) -> None:
        self.name, self.commands, self.env, self.ready, self.log = name, commands, env, ready, log
        self.processes: list[subprocess.Popen[bytes]] = []
        self.crashed: list[str] = []
        self.logdir = Path(tempfile.mkdtemp(prefix=f"bench-field-{name}-"))

    def __enter__(self) -> _PeerProcesses:
        try:
            for i, command in enumerate(self.commands):
                with open(self.logdir / f"{i}.log", "wb") as out:
                    self.processes.append(
                        subprocess.Popen(
                            command,
                            cwd=ROOT,
                            env=self.env,
                            stdin=subprocess.DEVNULL,
                            stdout=out,
                            stderr=subprocess.STDOUT,
                            start_new_session=True,
                        )
                    )
            deadline = time.monotonic() + 60
            while not self.ready():
                self.check()
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{self.name} workers not ready within 60 s{self._tail(0)}")
                time.sleep(0.1)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _tail(self, i: int) -> str:
        try:
            text = (self.logdir / f"{i}.log").read_text(errors="replace").strip()
        except OSError:
            return ""
        return f"; its output ends: {text[-1500:]}" if text else ""

    def check(self) -> None:
        for i, p in enumerate(self.processes):
            code = p.poll()
            if code is not None:
                raise RuntimeError(f"{self.name} worker process {p.pid} died (exit code {code}){self._tail(i)}")

    def _children(self) -> list[Any]:
        import psutil

        found = []
        for p in self.processes:
            with contextlib.suppress(psutil.Error):
                found += psutil.Process(p.pid).children(recursive=True)
        return found

    def __exit__(self, *exc: Any) -> None:
        import psutil

        children = self._children()
        running = [p for p in self.processes if p.poll() is None]
        for p in running:
            with contextlib.suppress(ProcessLookupError):
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 30
        for i, p in enumerate(self.processes):
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.crashed.append(f"{self.name} worker process {p.pid} did not stop within 30 s; killed")
                p.kill()
                p.wait(5)
                continue
            if p in running and p.returncode != 0:
                self.crashed.append(f"{self.name} worker process {p.pid} exited with {p.returncode}{self._tail(i)}")
        _, alive = psutil.wait_procs(children, timeout=5)
        for child in alive:
            with contextlib.suppress(psutil.Error):
                if child.status() != psutil.STATUS_ZOMBIE:
                    self.crashed.append(f"{self.name}: process {child.pid} outlived its worker; killed")
                    child.kill()
        if self.crashed:
            self.log(f"field/{self.name}: worker logs kept in {self.logdir}")
        else:
            shutil.rmtree(self.logdir, ignore_errors=True)


def _make(name: str, ctx: Ctx) -> _System:
    peer: dict[str, type[_Peer]] = {"celery": _Celery, "huey": _Huey, "rq": _Rq}
    return peer[name]() if name in peer else _Dramatiq(name, ctx)


def _warm_up(system: _System, record: redis.Redis, workers: Any, p: dict[str, Any]) -> None:
    """One job through the whole path (connections open, scripts loaded, the scheduler
    running), then ``settle`` s for start-up chatter to pass, outside the window."""
    system.send(-1, p["warm_ms"])
    deadline = time.monotonic() + p["timeout"]
    while not record.llen(REC_KEY):
        workers.check()
        if time.monotonic() > deadline:
            raise RuntimeError(f"the warm-up job did not run within {p['timeout']} s")
        time.sleep(0.02)
    time.sleep(p["settle"])
    record.delete(REC_KEY)


def _delayed_part(ctx: Ctx, system: _System, record: redis.Redis, workers: Any, p: dict[str, Any]) -> dict[str, Any]:
    """The paced delayed workload; the window ends at the last record (then ``grace`` s
    more for late duplicates)."""
    rng = random.Random(55)  # the same delays for every system
    dues: dict[int, float] = {}
    n = p["n"]
    ctx.server.reset_stats()
    cpu0 = ctx.server.cpu_seconds()
    t0 = time.monotonic()
    for seq in range(n):
        time.sleep(max(0.0, t0 + seq / p["rate"] - time.monotonic()))
        dues[seq] = system.send(seq, rng.randint(p["delay_lo"], p["delay_hi"]))
    offer_s = time.monotonic() - t0
    deadline = time.monotonic() + max(0.0, (max(dues.values()) - time.time() * 1000) / 1000) + p["timeout"]
    complete = False
    while True:
        if record.llen(REC_KEY) >= n and set(dues) <= {seq for seq, _, _ in read_records(record)}:
            complete = True
        if complete or time.monotonic() > deadline:
            cpu_s = ctx.server.cpu_seconds() - cpu0
            stats = ctx.server.commandstats()
            break
        workers.check()
        time.sleep(0.02)
    window_s = time.monotonic() - t0
    time.sleep(p["grace"])
    res = analyze(dues, read_records(record))
    # The records are on another server: nothing of the recorder's to take off.
    counts = {name: calls for name, (calls, _) in stats.items() if name not in NOT_COUNTED and calls}
    top = sorted(((c, name) for name, c in counts.items()), reverse=True)[:10]
    res.update(
        complete=complete,
        offer_rate=round(n / offer_s),
        window_s=round(window_s, 1),
        server_cpu_us_per_job=round(cpu_s * 1e6 / n, 1),
        commands_per_job=round(sum(counts.values()) / n, 1),
        top_commands_per_job={name: round(c / n, 2) for c, name in top},
        connection_commands_per_job={
            name: round(counts[name] / n, 3) for name in CONNECTION_COMMANDS if name in counts
        },
        script_calls_per_job=round(sum(stats.get(name, (0, 0))[0] for name in ("eval", "evalsha")) / n, 3),
    )
    return res


def _memory_part(ctx: Ctx, system: _System, p: dict[str, Any]) -> dict[str, Any]:
    """``scheduled`` jobs an hour out, no worker running: server bytes per job."""
    ctx.server.flush()
    system.open(ctx.server.url)
    try:
        before = ctx.server.used_memory()
        t0 = time.monotonic()
        system.schedule_far(list(range(p["scheduled"])))
        seconds = time.monotonic() - t0
        after = ctx.server.used_memory()
    finally:
        system.close()
    ctx.server.flush()
    return {
        "scheduled": p["scheduled"],
        "schedule_seconds": round(seconds, 2),
        "used_memory_before": before,
        "used_memory_after": after,
        "bytes_per_scheduled_job": round((after - before) / p["scheduled"], 1),
    }


def _run_system(ctx: Ctx, system: _System, record: redis.Redis, record_url: str, p: dict[str, Any]) -> dict[str, Any]:
    name = system.name
    ctx.server.flush()
    record.delete(REC_KEY, peers.READY_KEY)
    ctx.log(
        f"field/{name}: {p['n']} jobs, delays {p['delay_lo']}-{p['delay_hi']} ms, offered at {p['rate']}/s, "
        f"workers {system.workers_text(p)}"
    )
    system.open(ctx.server.url)
    workers = system.workers(ctx, p, record_url)
    try:
        with workers as w:
            _warm_up(system, record, w, p)
            res = _delayed_part(ctx, system, record, w, p)
    finally:
        system.close()
        for msg in workers.crashed:
            ctx.fail(f"field/{name}: {msg}")
    ctx.check_delivery("field", name, res)
    if name not in ("redisson", "redisson-lrem") and (res["lost"] or res["duplicated"] or res["unexpected"]):
        ctx.log(f"field/{name}: {res['lost']} lost, {res['duplicated']} duplicated, {res['unexpected']} unexpected")
    ctx.log(f"field/{name}: {p['scheduled']} jobs scheduled an hour out, workers stopped")
    res["memory"] = _memory_part(ctx, system, p)
    record.delete(REC_KEY)
    return res


def field(ctx: Ctx) -> dict[str, Any]:
    p = ctx.p["field"]
    data: dict[str, Any] = {"params": p}
    rows: list[dict[str, Any]] = []
    # Ours and built-in follow --brokers (redisson-lrem: same offer and consumer paths
    # but the transfer, which the lateness scenarios compare); the peers follow "systems".
    names = [s for s in p["systems"] if s in PEERS or s in ctx.brokers]
    record_server = Server(None)  # the records' own server, never the one under test
    try:
        for name in names:
            system = _make(name, ctx)
            why = system.missing()
            if why is not None:
                ctx.log(f"field/{name}: skipped: {why}")
                data[name] = {"skipped": why}
                rows.append({"system": name, "workers": system.workers_text(p), "ran": "skipped: not installed"})
                continue
            try:
                res = _run_system(ctx, system, record_server.r, record_server.url, p)
            except Exception as e:
                ctx.fail(f"field/{name}: crashed: {e!r}")
                data[name] = {"error": repr(e)}
                rows.append({"system": name, "workers": system.workers_text(p), "ran": "failed"})
                continue
            data[name] = res
            lat = res["lateness_ms"]
            rows.append(
                {
                    "system": name,
                    "workers": system.workers_text(p),
                    "ran": f"{res['ran']}/{res['expected']}",
                    "lost": res["lost"],
                    "dup": res["duplicated"],
                    "early": res["early"],
                    "p50 ms": lat["p50"],
                    "p99 ms": lat["p99"],
                    "max ms": lat["max"],
                    "server CPU us/job": res["server_cpu_us_per_job"],
                    "commands/job": res["commands_per_job"],
                    "bytes/scheduled job": res["memory"]["bytes_per_scheduled_job"],
                }
            )
    finally:
        record_server.stop()
    targets = _ratios(data, rows)
    return {"data": data, "rows": rows, "targets": targets}


def _ratios(data: dict[str, Any], rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Ours against built-in and against the cheapest peer that ran, in server CPU per job:
    columns of ours' row, and lines of the summary (information, no verdict)."""

    def cpu(name: str) -> float | None:
        entry = data.get(name) or {}
        return entry.get("server_cpu_us_per_job")

    ours = cpu("redisson")
    ran = [(cpu(name), name) for name in PEERS if cpu(name) is not None]
    cheapest = min(ran)[1] if ran else None
    data["ratios"] = {
        "cpu_vs_builtin": _ratio(ours, cpu("builtin")),
        "cheapest_peer": cheapest,
        "cpu_vs_cheapest_peer": _ratio(ours, cpu(cheapest)) if cheapest else None,
    }
    for row in rows:
        if row["system"] == "redisson" and ours is not None:
            row["CPU vs builtin"] = data["ratios"]["cpu_vs_builtin"]
            row["CPU vs cheapest peer"] = data["ratios"]["cpu_vs_cheapest_peer"]
    targets = []
    if ours is not None and cpu("builtin") is not None:
        targets.append(
            {
                "target": "field: server CPU per job, ours vs built-in (information)",
                "value": f"{ours} vs {cpu('builtin')} us = {data['ratios']['cpu_vs_builtin']}x",
                "met": None,
            }
        )
    if ours is not None and cheapest is not None:
        targets.append(
            {
                "target": "field: server CPU per job, ours vs the cheapest peer (information)",
                "value": f"{ours} vs {cpu(cheapest)} us ({cheapest}) = {data['ratios']['cpu_vs_cheapest_peer']}x",
                "met": None,
            }
        )
    return targets


__all__ = ["PEERS", "SYSTEMS", "field"]
