"""Worker processes: ``procs`` children, each running a Dramatiq ``Worker`` (entry point
``_child.worker_main``)."""

from __future__ import annotations

import multiprocessing as mp
import time
from collections.abc import Sequence
from typing import Any

from ._product import product_origin


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
