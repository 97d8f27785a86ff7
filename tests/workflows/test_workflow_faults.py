"""Workflows under faults (issue 57): a kill -9 of a worker process during a group, a
server restart with ``appendfsync always``, and a lost reply to a step's record.

Each test runs the fault suite's set-up (``tests/harness/faults``): a faulted server
started here (``appendonly yes``, on a free port, restartable on it with its data), a
record server no fault touches, and one ``python -m dramatiq
tests.workflows.workflow_fault_app:broker --processes 2 --threads 2`` command, started
again when it exits as the suite's fleet does. The test process runs
``chain(wf_start(), group([wf_member(i, work_ms) for i in range(MEMBERS)]), wf_complete())``
on the faulted server, injects the fault while members run, waits until the workflow has
finished and every message of the queue is acked (nothing left to run again), and checks,
from the runs recorded on the record server (see ``workflow_fault_app``):

- the completion ran exactly once, and got the list of every member's result, in order;
- every member finished at least once (none lost);
- a step ran more than once only where the fault explains it: each of its runs but the
  last finished one was disrupted by the fault (``analysis.disrupted``: it ran in the
  killed process, overlapped the server's outage, or overlapped a lost reply, with the
  suite's 1 s slack for the ack after a run);
- ``broker.workflows.get(id)`` says "done", with every step "done" and the completion's
  result;

and that the fault landed where it was meant to (a member's run cut short, an outage
inside the group, lost replies). The lost reply is a real one: the workers reach the
faulted server through a TCP proxy (:class:`ReplyDropper`) that lets the record call of
a chosen step run on the server and then drops its reply and closes the connection.

Marked ``faults`` (tox runs that layer apart, ``-m faults``); about 5-10 s each.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import dramatiq
import pytest

from dramatiq_redisson import RedissonBroker
from dramatiq_redisson.workflows import WorkflowState, chain, group
from tests.harness.faults.analysis import Run, disrupted
from tests.harness.faults.fault_common import FINISH, START, Record, Stamper, records_key
from tests.harness.faults.procs import DEFAULT_PRODUCT_ROOT, ValkeyProcess, WorkerFleet, subprocess_env
from tests.harness.faults.runner import RecordReader, boot_fleet, prepare, record_server, start_faulted, stop_fleet
from tests.harness.faults.scenarios import KILL9_MAX_RECOVERY_MS, Event, Scenario, Size, no_fault
from tests.harness.topology import wait_until

APP = "tests.workflows.workflow_fault_app:broker"
QUEUE = "workflow-faults"
#: Members of the group, and how long each works (ms): about 0.8 s of work for the
#: fleet's 4 threads, so that the fault lands while the group runs.
MEMBERS = 60
WORK_MS = 50
#: 1 command x 2 processes x 2 threads (``messages`` and ``rate`` are the producer's, unused).
SIZE = Size("workflow", messages=MEMBERS, rate=0, commands=1, processes=2, threads=2, scale=1.0, grace_s=10)
#: A record of a reply the proxy lost (``seq``: the member), written by the test.
LOST_REPLY = "lost-reply"


def expected_results() -> list[str]:
    """The group's result: each member's return value (``workflow_fault_app.member_result``), in order."""
    return [f"member-{i:04d}" for i in range(MEMBERS)]


def step(actor_name: str, *args: Any) -> dramatiq.Message[Any]:
    """A message of one of ``workflow_fault_app``'s actors (this process does not declare them)."""
    return dramatiq.Message(queue_name=QUEUE, actor_name=actor_name, args=args, kwargs={}, options={})


def the_workflow(work_ms: Callable[[int], int]) -> chain:
    return chain(
        step("wf_start"),
        group([step("wf_member", i, work_ms(i)) for i in range(MEMBERS)]),
        step("wf_complete"),
    )


# -- what the records say ------------------------------------------------------------------


@dataclass
class Outcome:
    """The runs recorded on the record server, by step (actor, member index), and the
    faults recorded there (lost replies)."""

    runs: dict[tuple[str, int], list[Run]]
    #: What each finished run of the completion got.
    got: list[Any]
    lost_replies: list[Event]

    @classmethod
    def of(cls, records: list[Record]) -> Outcome:
        runs: dict[str, Run] = {}
        steps: dict[str, tuple[str, int]] = {}
        got: list[Any] = []
        lost: list[Event] = []
        for record in records:
            if record.kind == LOST_REPLY:
                lost.append(Event(LOST_REPLY, record.ms, record.ms))
                continue
            if record.kind not in (START, FINISH):
                continue
            actor, run_id, *payload = record.extra.split(",", 2)
            if record.kind == START:
                runs[run_id] = Run(run_id, record.seq, record.attempt, record.pid, record.ms)
                steps[run_id] = (actor, record.seq)
            else:
                runs[run_id].end, runs[run_id].end_ms = FINISH, record.ms
                if actor == "wf_complete":
                    got.append(json.loads(payload[0]))
        by_step: dict[tuple[str, int], list[Run]] = defaultdict(list)
        for run_id, run in runs.items():
            by_step[steps[run_id]].append(run)
        for step_runs in by_step.values():
            step_runs.sort(key=lambda run: run.start_ms)
        return cls(dict(by_step), got, lost)

    def member(self, i: int) -> list[Run]:
        return self.runs.get(("wf_member", i), [])

    def finished_members(self) -> int:
        return sum(1 for i in range(MEMBERS) if any(run.end == FINISH for run in self.member(i)))

    def unexplained(self, events: list[Event]) -> list[tuple[tuple[str, int], Run]]:
        """Runs of steps that ran more than once that no fault explains: every run but a
        step's last finished one must have been disrupted by one of ``events``."""
        found = []
        for key, step_runs in self.runs.items():
            finished = [run for run in step_runs if run.end == FINISH]
            kept = finished[-1] if finished else None
            found += [(key, run) for run in step_runs if run is not kept and not any(disrupted(run, e) for e in events)]
        return found

    def failures(self, events: list[Event]) -> list[str]:
        """What went wrong, as sentences (empty: nothing)."""
        out = []
        completions = self.runs.get(("wf_complete", 0), [])
        if len(completions) != 1 or completions[0].end != FINISH:
            out.append(f"the completion ran {len(completions)} times (finished {len(self.got)}), not once")
        if self.got and any(got != expected_results() for got in self.got):
            out.append(f"the completion got {self.got}, not the {MEMBERS} members' results in order")
        if not any(run.end == FINISH for run in self.runs.get(("wf_start", 0), [])):
            out.append("wf_start never finished")
        lost = [i for i in range(MEMBERS) if not any(run.end == FINISH for run in self.member(i))]
        if lost:
            out.append(f"members never finished (lost): {lost}")
        unexplained = self.unexplained(events)
        if unexplained:
            out.append(f"runs again that no fault explains: {unexplained}")
        return out

    def summary(self) -> str:
        again = {f"{actor}[{seq}]": len(runs) for (actor, seq), runs in self.runs.items() if len(runs) > 1}
        return f"steps that ran more than once (runs): {again or 'none'}; lost replies: {len(self.lost_replies)}"


def state_failures(state: WorkflowState | None) -> list[str]:
    if state is None:
        return ["broker.workflows.get() found no workflow"]
    out = []
    if state.state != "done":
        out.append(f"the workflow is {state.state!r}, not 'done'")
    not_done = [(s.path, s.actor, s.state) for s in state.steps if s.state != "done"]
    if not_done or len(state.steps) != MEMBERS + 2:
        out.append(f"{len(state.steps)} steps, those not done: {not_done}")
    if state.result != MEMBERS:
        out.append(f"the workflow's result is {state.result!r}, not {MEMBERS} (the completion's)")
    return out


# -- the set-up: servers, workers, the workflow ----------------------------------------------


@pytest.fixture(scope="module")
def records() -> Iterator[ValkeyProcess]:
    with record_server() as server:
        yield server


@dataclass
class Rig:
    """One test's faulted server, workers, records and the broker (on the faulted server,
    straight, not through any proxy) that runs and reads the workflow."""

    scenario: Scenario
    records: ValkeyProcess
    server: ValkeyProcess
    workdir: Path
    prefix: str
    reader: RecordReader
    broker: RedissonBroker
    fleet: WorkerFleet | None = None
    proxy: ReplyDropper | None = None
    events: list[Event] = field(default_factory=list)
    exits: list[int] = field(default_factory=list)

    def boot(self, url: str | None = None) -> None:
        """Start the worker command on ``url`` (default: the faulted server) and wait until
        its processes are ready."""
        env = subprocess_env(
            DEFAULT_PRODUCT_ROOT,
            {
                "FAULTS_BROKER_URL": url or self.server.url,
                "FAULTS_RECORD_URL": self.records.url,
                "FAULTS_PREFIX": self.prefix,
                "FAULTS_QUEUE": QUEUE,
            },
        )
        self.fleet = boot_fleet(
            APP, self.scenario, SIZE, env, self.workdir, self.reader, lambda command, code: self.exits.append(code)
        )

    def outcome(self) -> Outcome:
        self.reader.poll()
        return Outcome.of(self.reader.records)

    def logs(self, tail: int = 3000) -> str:
        """The workers' output, the last ``tail`` characters of each log (0: all of it)."""
        commands = self.fleet.commands if self.fleet is not None else []
        return "\n".join(f"--- {c.log_path}:\n{c.log_path.read_text(errors='replace')[-tail:]}" for c in commands)

    def unrecorded(self) -> int:
        """How many times the middleware logged that a step could not be recorded."""
        return self.logs(tail=0).count("could not be recorded")

    def finish(self, workflow_id: str, timeout: float = 40.0) -> WorkflowState | None:
        """Wait until the workflow has finished and no message of the queue is left to run
        (scheduled, ready or unacked: a step that may still run again); its state then."""

        def finished() -> bool:
            state = self.broker.workflows.get(workflow_id)
            return state is not None and state.finished

        wait_until(finished, timeout, f"workflow {workflow_id} to finish", logs=self.logs)
        wait_until(lambda: self.broker.pending(QUEUE) == 0, 30, "every message to be acked", logs=self.logs)
        return self.broker.workflows.get(workflow_id)

    def verdict(self, state: WorkflowState | None, *more: str) -> None:
        """Assert the checks of the module docstring (and ``more`` failures)."""
        outcome = self.outcome()
        failures = [*outcome.failures(self.events + outcome.lost_replies), *state_failures(state), *more]
        print(f"\n{self.scenario.name}: {outcome.summary()}; records that failed: {self.unrecorded()}")
        if failures:  # the record server's list is deleted at the end: keep a copy with the logs
            with open(self.workdir / "records.txt", "w") as out:
                out.writelines(f"{r.kind}|{r.seq}|{r.attempt}|{r.pid}|{r.extra}|{r.ms}\n" for r in self.reader.records)
        assert not failures, (
            f"{self.scenario.name}: {'; '.join(failures)}\n{outcome.summary()}\nevents: {self.events}\n"
            f"records and logs: {self.workdir}"
        )


@contextlib.contextmanager
def rig(records: ValkeyProcess, name: str, server_config: dict[str, str] | None = None) -> Iterator[Rig]:
    """A faulted server (the suite's base configuration, ``appendonly yes``, and
    ``server_config``) and a broker on it; the workers start with :meth:`Rig.boot`.
    Everything is stopped by pid at the end; the working directory (server and worker
    logs) is kept when the test failed."""
    scenario = Scenario(name, no_fault, "a workflow under a fault", server_config=server_config or {})
    _, workdir, prefix, reader, server = prepare(scenario, records)
    setup: Rig | None = None
    failed = False
    try:
        server = start_faulted(server, workdir)
        setup = Rig(scenario, records, server, workdir, prefix, reader, RedissonBroker(url=server.url))
        yield setup
    except BaseException:
        failed = True
        raise
    finally:
        if setup is not None:
            if setup.fleet is not None:
                stop_fleet(setup.fleet, setup.exits, {})
            if setup.proxy is not None:
                setup.proxy.stop()
            setup.broker.close()
        server.stop()
        reader.close()
        if not failed:
            shutil.rmtree(workdir, ignore_errors=True)


# -- a proxy that loses replies -------------------------------------------------------------


def next_command(buffer: bytes, pos: int) -> tuple[list[bytes], int] | None:
    """The client command (RESP array of bulk strings, or an inline command) at ``pos`` in
    ``buffer`` and where it ends; None if it is not all there yet."""
    end = buffer.find(b"\r\n", pos)
    if end < 0:
        return None
    if buffer[pos : pos + 1] != b"*":
        return buffer[pos:end].split(), end + 2
    count = int(buffer[pos + 1 : end])
    args: list[bytes] = []
    pos = end + 2
    for _ in range(count):
        end = buffer.find(b"\r\n", pos)
        if end < 0:
            return None
        start = end + 2
        stop = start + int(buffer[pos + 1 : end])
        if len(buffer) < stop + 2:
            return None
        args.append(buffer[start:stop])
        pos = stop + 2
    return args, pos


@dataclass
class _Cut:
    """A proxied connection's command whose reply is lost, once there is one."""

    args: list[bytes] | None = None


class ReplyDropper:
    """A TCP proxy on a free loopback port in front of the faulted server that loses
    replies: a command for which ``lose(args)`` is true is sent to the server, its reply
    (which shows the command ran) is read and thrown away, ``dropped(args)`` is called,
    and the client's connection is closed. Everything else passes both ways as is.

    A command's reply is the next data the server sends on its connection because the
    broker's script calls wait for each reply before they send the next call. It runs an
    asyncio loop in a daemon thread of the test process."""

    def __init__(
        self, upstream_port: int, lose: Callable[[list[bytes]], bool], dropped: Callable[[list[bytes]], None]
    ) -> None:
        self.upstream_port = upstream_port
        self.lose = lose
        self.dropped = dropped
        self.port = 0
        self.errors: list[BaseException] = []
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="reply-dropper", daemon=True)
        self._server: asyncio.Server | None = None
        self._handlers: set[asyncio.Task[Any]] = set()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> ReplyDropper:
        self._thread.start()
        listening = asyncio.start_server(self._handle, "127.0.0.1", 0)
        self._server = asyncio.run_coroutine_threadsafe(listening, self._loop).result(10)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self._close(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    async def _close(self) -> None:
        for task in list(self._handlers):
            task.cancel()
        await asyncio.gather(*self._handlers, return_exceptions=True)
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        await asyncio.sleep(0)  # let the aborted transports close

    async def _handle(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        except OSError:
            client_writer.transport.abort()
            self._handlers.discard(task)
            return
        cut = _Cut()
        requests = asyncio.ensure_future(self._requests(client_reader, upstream_writer, cut))
        replies = asyncio.ensure_future(self._replies(upstream_reader, client_writer, cut))
        try:
            done, _ = await asyncio.wait({requests, replies}, return_when=asyncio.FIRST_COMPLETED)
            if requests in done and cut.args is not None:
                await asyncio.wait_for(replies, 10)  # the lost command's reply comes and is dropped
        except (OSError, asyncio.TimeoutError):
            pass
        finally:
            for pump in (requests, replies):
                pump.cancel()
            await asyncio.gather(requests, replies, return_exceptions=True)
            client_writer.transport.abort()
            upstream_writer.transport.abort()
            self._handlers.discard(task)

    async def _requests(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, cut: _Cut) -> None:
        """Client to server, command by command, until a command whose reply is lost."""
        buffer = b""
        while data := await reader.read(1 << 16):
            buffer += data
            pos = 0
            while (command := next_command(buffer, pos)) is not None:
                args, end = command
                if self._decide(args):
                    cut.args = args
                writer.write(buffer[pos:end])
                pos = end
                if cut.args is not None:
                    await writer.drain()
                    return
            buffer = buffer[pos:]
            await writer.drain()

    async def _replies(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, cut: _Cut) -> None:
        """Server to client, until the reply of the lost command, which is dropped."""
        while data := await reader.read(1 << 16):
            if cut.args is not None:
                self._notify(cut.args)
                return
            writer.write(data)
            await writer.drain()

    def _decide(self, args: list[bytes]) -> bool:
        try:
            return self.lose(args)
        except Exception as e:  # noqa: BLE001 - reported by the test
            self.errors.append(e)
            return False

    def _notify(self, args: list[bytes]) -> None:
        try:
            self.dropped(args)
        except Exception as e:  # noqa: BLE001 - reported by the test
            self.errors.append(e)


# -- the checks themselves (no server) --------------------------------------------------------


def test_the_checks_find_a_second_completion_a_lost_member_and_a_run_again_no_fault_explains() -> None:
    # Given records where member 3 never finished, member 5 and member 7 ran twice (only
    # 7's first run was in a process killed while it ran), and the completion ran twice
    def run(actor: str, seq: int, pid: int, ms: int, finished: bool = True, payload: str = "") -> list[Record]:
        extra = f"{actor},{pid}.{ms}"
        out = [Record(START, seq, 0, pid, extra, ms)]
        if finished:
            out.append(Record(FINISH, seq, 0, pid, f"{extra},{payload}" if payload else extra, ms + 50))
        return out

    got = json.dumps(expected_results())
    recorded = run("wf_start", 0, 1, 0)
    for i in range(MEMBERS):
        if i != 7:
            recorded += run("wf_member", i, 1, 100 + i, finished=i != 3)
    recorded += run("wf_member", 5, 2, 9_000) + run("wf_member", 7, 1, 5_000, finished=False)
    recorded += run("wf_member", 7, 2, 9_100)
    recorded += run("wf_complete", 0, 2, 10_000, payload=got) + run("wf_complete", 0, 2, 10_100, payload=got)
    kill = Event("kill9", 5_010, 5_010, pid=1)

    # When they are checked
    failures = Outcome.of(recorded).failures([kill])

    # Then each is found, and 7's second run is explained by the kill
    assert [f.split(" ")[:3] for f in failures] == [
        ["the", "completion", "ran"],
        ["members", "never", "finished"],
        ["runs", "again", "that"],
    ], failures
    assert "[3]" in failures[1]
    assert "('wf_member', 5)" in failures[2] and "('wf_member', 7)" not in failures[2]


# -- the faults -----------------------------------------------------------------------------


def test_kill9_of_a_worker_process_during_the_group_runs_the_completion_once(records: ValkeyProcess) -> None:
    """The dramatiq CLI stops its other process when one dies and exits; the fleet starts
    the command again, and its new processes find the killed one dead by its closed
    connections (the broker's liveness) and requeue the members it held."""
    with rig(records, "workflow-kill9") as r:
        # Given workers running a workflow whose group has started
        r.boot()
        workflow = the_workflow(lambda i: WORK_MS).run(broker=r.broker)

        # When a worker process is killed (SIGKILL) while it runs members, once a quarter
        # of them finished: the one that started a member last, so that it is mid-run
        def victim() -> int | None:
            outcome = r.outcome()
            if outcome.finished_members() == MEMBERS:
                raise AssertionError("the group finished before the fault could land")
            if outcome.finished_members() < MEMBERS // 4 or r.fleet is None:
                return None
            alive = set(r.fleet.worker_pids())
            running = [run for i in range(MEMBERS) for run in outcome.member(i) if run.end is None and run.pid in alive]
            return max(running, key=lambda run: run.start_ms).pid if running else None

        pid = wait_until(victim, 30, "a worker process running a member")
        at = r.reader.now_ms()
        os.kill(pid, signal.SIGKILL)
        r.events.append(Event("kill9", at, at, pid=pid))
        state = r.finish(workflow.id)

        # Then the killed runs ran again elsewhere (liveness), the completion ran once
        # with every result, and the workflow is done
        outcome = r.outcome()
        cut = [i for i in range(MEMBERS) for run in outcome.member(i) if run.pid == pid and run.end is None]
        back_after = [
            min((run.start_ms - at for run in outcome.member(i) if run.start_ms > at), default=0) for i in cut
        ]
        print(f"\nmembers the killed process ran: {cut}, ran again after (ms): {back_after}")
        problems = []
        if not cut:
            problems.append(f"the kill of {pid} cut no member's run short")
        if max(back_after, default=0) > KILL9_MAX_RECOVERY_MS:
            problems.append(f"members the killed process ran came back after {back_after} ms")
        r.verdict(state, *problems)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_server_restart_with_appendfsync_always_during_the_group_runs_the_completion_once(
    records: ValkeyProcess, signum: signal.Signals
) -> None:
    """Members that finish while the server is down cannot record: the middleware leaves
    them unacked and they run again once it is back; what was recorded before the stop
    (fsynced before each reply) is there after the restart."""
    with rig(records, f"workflow-restart-{signum.name.lower()}", {"appendfsync": "always"}) as r:
        # Given workers running a workflow whose group has started
        r.boot()
        workflow = the_workflow(lambda i: WORK_MS).run(broker=r.broker)

        def quarter_done() -> bool:
            finished = r.outcome().finished_members()
            if finished == MEMBERS:
                raise AssertionError("the group finished before the fault could land")
            return finished >= MEMBERS // 4

        wait_until(quarter_done, 30, "a quarter of the members to finish")

        # When the server stops (SIGTERM: a clean shutdown; SIGKILL: a crash) and starts
        # again on the same port with its AOF a second later
        at = r.reader.now_ms()
        r.server.signal(signum)
        r.server.wait_exit()
        time.sleep(1.0)
        r.server.start()
        back = r.reader.now_ms()
        r.events.append(Event(signum.name, at, back, resumed=True))
        state = r.finish(workflow.id)

        # Then the group went on after the restart, the completion ran once with every
        # result, and the workflow is done
        outcome = r.outcome()
        first_ends = [min((run.end_ms or 0 for run in outcome.member(i) if run.end), default=0) for i in range(MEMBERS)]
        problems = []
        if not (any(0 < end < at for end in first_ends) and any(end > back for end in first_ends)):
            problems.append("the outage did not fall inside the group (members finished before it and after it)")
        if r.unrecorded() == 0:
            problems.append("no member's record failed during the outage")
        r.verdict(state, *problems)


#: How the proxy loses the replies to the record calls of the last member:
#:
#: - ``one``: the first call's reply. The broker sends the call again on a fresh
#:   connection at once (its script runner retries a record whose connection closed,
#:   once), the script answers "again" with the completion to send, and the step is
#:   acked: the member ran once.
#: - ``until-run-again``: every reply until the member runs again. The call made again
#:   is lost too, so the record raises and the middleware leaves the step unacked; its
#:   worker's next reconciliation (``safety_interval``, 5 s) requeues it, it runs again,
#:   and that run's record answers "again" and sends the completion.
LOSSES = ("one", "until-run-again")


@pytest.mark.parametrize("loss", LOSSES)
def test_lost_replies_to_the_record_of_the_last_member_run_the_completion_once(
    records: ValkeyProcess, loss: str
) -> None:
    """A real lost reply: the workers reach the faulted server through
    :class:`ReplyDropper`, which lets the record call (EVALSHA of step.lua) of the last
    member to finish reach the server, where it runs, then drops its reply and closes the
    connection. That call is the one that finishes the group and returns the
    completion's send, so the completion is sent only by a call made again."""
    last = MEMBERS - 1
    with rig(records, f"workflow-lost-reply-{loss}") as r:
        index = r.broker.workflows.keys.index.encode()  # KEYS[2] of every workflow script
        marker = json.dumps(f"member-{last:04d}").encode()  # ARGV "result" of its record
        stamper = Stamper(r.records.url, r.prefix)
        chosen = 0

        def runs_of_last() -> int:
            raw = stamper.client.lrange(records_key(r.prefix), 0, -1)
            parsed = (Record.parse(item) for item in raw)
            return sum(
                1 for rec in parsed if rec.kind == START and rec.seq == last and rec.extra.startswith("wf_member,")
            )

        def lose(args: list[bytes]) -> bool:
            if not (args and args[0].upper() == b"EVALSHA" and index in args and marker in args):
                return False
            nonlocal chosen
            if (chosen == 0) if loss == "one" else runs_of_last() < 2:
                chosen += 1
                return True
            return False

        def dropped(args: list[bytes]) -> None:
            stamper(LOST_REPLY, last)

        try:
            # Given workers behind the proxy, running a workflow whose last member works longest
            r.proxy = ReplyDropper(r.server.port, lose, dropped).start()
            r.boot(r.proxy.url)
            workflow = the_workflow(lambda i: 1000 if i == last else WORK_MS).run(broker=r.broker)

            # When the replies to its record are lost (see LOSSES)
            state = r.finish(workflow.id)
        finally:
            stamper.close()

        # Then the completion ran once with every result, and the workflow is done
        outcome = r.outcome()
        runs = outcome.member(last)
        others = [run.end_ms or 0 for i in range(last) for run in outcome.member(i)]
        wanted_runs = 1 if loss == "one" else 2
        problems = [f"proxy errors: {r.proxy.errors}"] if r.proxy and r.proxy.errors else []
        if not outcome.lost_replies or (loss == "one" and len(outcome.lost_replies) != 1):
            problems.append(f"{len(outcome.lost_replies)} replies lost")
        if len(runs) != wanted_runs:
            problems.append(f"the last member ran {len(runs)} times, not {wanted_runs}")
        if not runs or not runs[0].end_ms or runs[0].end_ms < max(others, default=0):
            problems.append("the last member's first run was not the group's last to finish")
        unrecorded = r.unrecorded()
        if (loss == "one") != (unrecorded == 0):
            problems.append(f"the middleware logged {unrecorded} steps that could not be recorded")
        r.verdict(state, *problems)
