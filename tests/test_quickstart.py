"""The README's quickstart, run as written: the dev server, the reader's own ``tasks.py``, a
worker started with Dramatiq's own command, a send now and one delayed, then the CLI,
the dashboard and the metrics it names. The commands and the file come from the README
itself (between its ``quickstart`` markers), so a page that stops working fails here."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from dramatiq_redisson.embedded import free_loopback_port
from tests.helpers import sigint_as_in_a_terminal, wait_for

README = Path(__file__).resolve().parent.parent / "README.md"
BIN = Path(sys.executable).parent

pytestmark = pytest.mark.slow


def quickstart() -> str:
    text = README.read_text()
    start, end = text.index("<!-- quickstart-start -->"), text.index("<!-- quickstart-end -->")
    return text[start:end]


def blocks(section: str, language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", section, re.S)


def commands(block: str) -> list[str]:
    """The commands of a shell block: with ``$ `` prompts, the prompted lines only (the rest
    is output); comments dropped."""
    lines = block.splitlines()
    if any(line.startswith("$ ") for line in lines):
        lines = [line[2:] for line in lines if line.startswith("$ ")]
    return [line.split("  #", 1)[0].strip() for line in lines if line.strip()]


class Process:
    """A command of the page, run in the background with its output kept."""

    def __init__(self, command: str, cwd: Path, env: dict[str, str]) -> None:
        self.log = cwd / f"{abs(hash(command))}.log"
        self.file = self.log.open("wb")
        self.proc = subprocess.Popen(
            f"exec {command}",
            shell=True,
            cwd=cwd,
            env=env,
            stdout=self.file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=sigint_as_in_a_terminal,  # stopped by SIGINT, as by Ctrl-C
        )

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> int:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGINT)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.file.close()
        return self.proc.returncode


@pytest.fixture
def page_env(tmp_path: Path) -> Iterator[tuple[Path, dict[str, str], int]]:
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", "PYTHONUNBUFFERED": "1"}
    env.pop("REDIS_URL", None)
    yield tmp_path, env, free_loopback_port()


def test_the_readme_quickstart_works_as_written(page_env: tuple[Path, dict[str, str], int]) -> None:
    workdir, env, port = page_env
    section = quickstart()
    shell = blocks(section, "sh")
    (tasks,) = blocks(section, "python")
    page_port = re.search(r"--port (\d+)", shell[0])
    assert page_port, shell[0]

    def here(command: str) -> str:  # the page's port, made a free one
        return command.replace(page_port.group(1), str(port))

    started: list[Process] = []
    try:
        # 1. The dev server, in the foreground: it prints the URL the rest uses.
        (server_command,) = commands(shell[0])
        server = Process(here(server_command), workdir, env)
        started.append(server)
        url = f"redis://127.0.0.1:{port}/0"
        assert wait_for(lambda: url in server.output(), timeout=30), server.output()

        # 2. The reader's own tasks.py, and a worker from its directory.
        (workdir / "tasks.py").write_text(tasks)
        exports = [c for c in commands(shell[1]) if c.startswith("export ")]
        assert exports == [f"export REDIS_URL=redis://127.0.0.1:{page_port.group(1)}/0"], exports
        env = {**env, "REDIS_URL": url}
        (worker_command,) = [c for c in commands(shell[1]) if not c.startswith("export ")]
        worker = Process(here(worker_command), workdir, env)
        started.append(worker)
        assert wait_for(lambda: "ready for action" in worker.output(), timeout=60), worker.output()

        # 3. A send now and one in 5 s, as the page writes it (the whole block, in a shell).
        sent_at = time.monotonic()
        send = subprocess.run(
            here(shell[2]), shell=True, cwd=workdir, env=env, capture_output=True, text=True, timeout=60
        )
        assert send.returncode == 0, send.stderr
        message_id = send.stdout.strip().splitlines()[-1]
        assert re.fullmatch(r"[0-9a-f-]{36}", message_id), send.stdout
        assert wait_for(lambda: "hello, Bob" in worker.output(), timeout=20), worker.output()

        # 4. The CLI while Ada waits: her message is listed as scheduled.
        looks = commands(shell[3])
        for command in looks:
            if " dashboard" in command or " metrics" in command:
                continue
            done = subprocess.run(command, shell=True, cwd=workdir, env=env, capture_output=True, text=True, timeout=60)
            assert done.returncode == 0, (command, done.stdout, done.stderr)
            if " list default" in command:
                assert message_id in done.stdout, done.stdout
        assert wait_for(lambda: "hello, Ada" in worker.output(), timeout=20), worker.output()
        assert time.monotonic() - sent_at >= 4.9

        # 5. The dashboard and the metrics the page names, each on a free port of ours.
        for command, path, expected in (
            (next(c for c in looks if " dashboard" in c), "/", "dramatiq"),
            (next(c for c in looks if " metrics" in c), "/metrics", "dramatiq_redisson"),
        ):
            http_port = free_loopback_port()
            served = Process(f"{command} --port {http_port}", workdir, env)
            started.append(served)

            def answers(http_port: int = http_port, path: str = path) -> str | None:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{http_port}{path}", timeout=2) as reply:
                        return str(reply.read().decode())
                except OSError:
                    return None

            assert wait_for(lambda answers=answers: answers() is not None, timeout=30), served.output()
            assert expected in (answers() or ""), served.output()
            assert served.stop() in (0, -signal.SIGINT, 130), served.output()
    finally:
        for process in reversed(started):
            process.stop()
    # Ctrl-C stops the dev server with everything it started.
    assert server.proc.returncode == 0, server.output()
    alive = subprocess.run(["pgrep", "-f", f"valkey-server 127.0.0.1:{port}$"], capture_output=True, text=True)
    assert alive.stdout.strip() == "", alive.stdout
