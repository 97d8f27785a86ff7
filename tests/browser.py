"""A real headless Chromium and a real dashboard server, for the browser tests and the
README's screenshots.

Run ``python -m tests.browser --screenshots docs/img`` to fill an embedded server with a
demo (queues, scheduled and ready messages, dead letters of real failures, a paused
queue, messages running, an activity history) and save ``dashboard-overview.png``,
``dashboard-queue.png``, ``dashboard-activity.png`` and ``dashboard-running.png`` there.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import random
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from dramatiq_redisson.embedded import free_loopback_port
from tests.helpers import sigint_as_in_a_terminal

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Playwright

    from dramatiq_redisson import RedissonBroker

ROOT = Path(__file__).resolve().parent.parent

#: The flags of every launch: headless, and nothing that reaches out to the network.
CHROMIUM_ARGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)


def chromium_path() -> str:
    """The Chromium to drive: ``$CHROMIUM``, else Debian's ``/usr/bin/chromium``."""
    return os.environ.get("CHROMIUM") or "/usr/bin/chromium"


def missing_browser() -> str | None:
    """Why no browser can be driven here, or None when one can."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "playwright is not installed: pip install -e '.[test]'"
    path = chromium_path()
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        return f"no Chromium at {path} (set CHROMIUM, or apt-get install chromium)"
    return None


def launch(playwright: Playwright) -> Browser:
    """A headless Chromium on a fresh temporary profile (Playwright makes one per launch);
    never a downloaded browser."""
    return playwright.chromium.launch(executable_path=chromium_path(), args=list(CHROMIUM_ARGS))


@contextlib.contextmanager
def serve_dashboard(
    redis_url: str, *options: str, namespace: str = "dramatiq", env: dict[str, str] | None = None
) -> Iterator[str]:
    """Run ``dramatiq-redisson --url REDIS_URL --namespace NS dashboard --port PORT
    OPTIONS`` as a subprocess on a free loopback port; yield its root URL once it answers
    (any HTTP status counts: with authentication the first answer is a 401). The process
    is interrupted (by pid) at exit, and killed if it does not stop."""
    port = free_loopback_port()
    command = [
        sys.executable,
        "-m",
        "dramatiq_redisson",
        "--url",
        redis_url,
        "--namespace",
        namespace,
        "dashboard",
        "--port",
        str(port),
        *options,
    ]
    url = f"http://127.0.0.1:{port}/"
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(
            command,
            cwd=ROOT,
            env={**os.environ, **(env or {})},
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=sigint_as_in_a_terminal,  # stopped by SIGINT, as by Ctrl-C
        )

        def output() -> str:
            log.seek(0)
            return log.read().decode(errors="replace")[-3000:]

        try:
            deadline = time.monotonic() + 20
            while not _answers(url):
                if proc.poll() is not None:
                    raise RuntimeError(f"the dashboard exited with {proc.returncode}: {output()}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the dashboard did not answer on {url} within 20 s: {output()}")
                time.sleep(0.05)
            yield url
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2):
            return True
    except urllib.error.HTTPError as e:
        e.close()
        return True
    except OSError:
        return False


# -- screenshots ------------------------------------------------------------------------


def demo_history(broker: RedissonBroker, queue_name: str, per_minute: float, rng: random.Random) -> None:
    """Write 30 days of made-up activity into ``queue_name``'s history rings (demo only:
    the layout of ``scripts/lua/include/record_history.lua``, which only ack and nack
    write otherwise): a daily
    rhythm around ``per_minute`` processed messages a minute, a few retried and failed.
    The current minute is left to the real acks."""
    from dramatiq_redisson.admin._history import RING_HOURS, RING_MINUTES

    slot = struct.Struct(">IIII")
    now_minute = broker.admin.server_ms() // 60_000

    def counts(minute: int, scale: float) -> tuple[int, int, int]:
        daily = 1 + 0.6 * math.sin(2 * math.pi * ((minute / 60) % 24 - 9) / 24)
        processed = max(0, round(per_minute * scale * daily * rng.uniform(0.75, 1.25)))
        retried = sum(1 for _ in range(round(scale)) if rng.random() < 0.04 * per_minute / 10)
        failed = sum(1 for _ in range(round(scale)) if rng.random() < 0.012 * per_minute / 10)
        return processed, failed, retried

    minutes = bytearray(16 + 16 * RING_MINUTES)
    for minute in range(now_minute - 24 * 60, now_minute):
        processed, failed, retried = counts(minute, 1)
        at = 16 + 16 * (minute % RING_MINUTES)
        minutes[at : at + 16] = slot.pack(minute, processed, failed, retried)
    hours = bytearray(16 * RING_HOURS)
    now_hour = now_minute // 60
    for hour in range(now_hour - 30 * 24, now_hour + 1):
        first = hour * 60
        if hour >= now_hour - 24:  # the sum of its minutes above (all but the current one)
            known = [
                slot.unpack_from(minutes, 16 + 16 * (m % RING_MINUTES))
                for m in range(first, min(first + 60, now_minute))
            ]
            total = [sum(k[i] for k in known if k[0] >= now_minute - 24 * 60) for i in (1, 2, 3)]
        else:
            total = list(counts(first + 30, 60))
        hours[16 * (hour % RING_HOURS) : 16 * (hour % RING_HOURS) + 16] = slot.pack(hour, *total)
    keys = broker.keys(queue_name)
    broker.client.set(keys.minutes, bytes(minutes))
    broker.client.set(keys.hours, bytes(hours))


@contextlib.contextmanager
def demo(redis_url: str) -> Iterator[None]:
    """A realistic namespace for as long as the block runs: four queues, about 2,000
    scheduled messages of five actors with varied arguments and due times, ready ones, an
    overdue backlog on a queue no worker consumes (and paused), dead letters of real
    failures (with their tracebacks) from the worker of "billing", which keeps running,
    exports running on the worker of "exports" (one of them made to look stuck: its fetch
    time is set back 14 minutes), and 30 days of made-up activity history."""
    import logging

    import dramatiq
    from dramatiq.middleware import default_middleware

    from dramatiq_redisson import RedissonBroker

    broker = RedissonBroker(url=redis_url, middleware=[m() for m in default_middleware])
    broker.flush_all()
    rng = random.Random(7)

    @dramatiq.actor(broker=broker, queue_name="emails", max_retries=0)
    def send_welcome_email(user_id: int, locale: str = "en") -> None:
        pass

    @dramatiq.actor(broker=broker, queue_name="emails", max_retries=0)
    def send_digest(user_id: int, period: str, topics: list[str]) -> None:
        pass

    @dramatiq.actor(broker=broker, queue_name="billing", max_retries=0)
    def charge_invoice(invoice_id: str, amount_cents: int, currency: str = "EUR") -> None:
        if amount_cents % 7 == 0:
            raise RuntimeError(f"card declined for invoice {invoice_id}: insufficient funds")
        if amount_cents % 11 == 0:
            raise TimeoutError(f"payment gateway did not answer within 10s (invoice {invoice_id})")

    @dramatiq.actor(broker=broker, queue_name="reports", max_retries=0)
    def build_report(account: str, month: str) -> None:
        pass

    release = threading.Event()

    @dramatiq.actor(broker=broker, queue_name="exports", max_retries=0, time_limit=3_600_000)
    def export_account(account: str, fmt: str = "csv") -> None:
        release.wait(120)

    def delay(low_minutes: int, high_minutes: int) -> int:
        return rng.randrange(low_minutes * 60_000, high_minutes * 60_000)

    locales = ["en", "de", "fr", "pt-BR", "ja"]
    topics = ["releases", "security", "billing", "community", "changelog"]
    for _ in range(1600):
        user = 10_000 + rng.randrange(90_000)
        if rng.random() < 0.55:
            send_welcome_email.send_with_options(
                args=(user,), kwargs={"locale": rng.choice(locales)}, delay=delay(2, 600)
            )
        else:
            chosen = rng.sample(topics, rng.randrange(1, 4))
            period = rng.choice(["daily", "weekly"])
            send_digest.send_with_options(args=(user, period, chosen), delay=delay(2, 900))
    for i in range(400):
        charge_invoice.send_with_options(
            args=(f"INV-2025-{4000 + i:05d}", rng.randrange(500, 90_000)),
            kwargs={"currency": rng.choice(["EUR", "USD", "GBP"])},
            delay=delay(5, 1440),
        )
    for i in range(14):
        send_welcome_email.send(20_000 + i, locale=rng.choice(locales))
    accounts = ["acme", "globex", "initech", "umbrella", "hooli", "stark"]
    for account in accounts:
        build_report.send_with_options(args=(account, "2025-05"), delay=1)
    for account in accounts[:3]:
        build_report.send_with_options(args=(account, "2025-06"), delay=delay(60, 600))
    # Real failures on a running worker of "billing": the charges that raise die.
    failing = [("INV-2025-03117", 4900), ("INV-2025-03121", 12_100), ("INV-2025-03164", 7700)]
    for invoice, amount in failing:
        charge_invoice.send(invoice, amount, currency="EUR")
    for queue_name, per_minute in (("emails", 42), ("billing", 9), ("reports", 0.4), ("exports", 0.8)):
        demo_history(broker, queue_name, per_minute, rng)
    logging.getLogger("dramatiq").setLevel(logging.CRITICAL)  # the failures are expected
    worker = dramatiq.Worker(broker, queues={"billing", "exports"}, worker_threads=6, worker_timeout=100)
    worker.start()
    try:
        for account, fmt in (("acme", "parquet"), ("globex", "csv"), ("initech", "csv")):
            export_account.send(account, fmt=fmt)
        deadline = time.monotonic() + 20
        while len(broker.running("exports")) < 3:
            if time.monotonic() > deadline:
                raise RuntimeError("the demo's exports did not start in time")
            time.sleep(0.05)
        # Made to look stuck: the oldest export's fetch time set back (ages otherwise are
        # a second or so).
        fetched_key = broker.keys("exports").fetched
        for back_ms, running in zip((14 * 60_000, 3 * 60_000 + 12_000, 41_000), broker.running("exports"), strict=True):
            record = f"{running['fetched_ms'] - back_ms}|{running['worker_id']}|{running['consumer']}"
            broker.client.hset(fetched_key, running["redis_message_id"], record)
        broker.pause("reports")
        deadline = time.monotonic() + 20
        while broker.stats("billing")["queues"]["billing"]["dead"] < len(failing):
            if time.monotonic() > deadline:
                raise RuntimeError("the demo's failing charges did not die in time")
            time.sleep(0.05)
        # The reports go overdue: nothing consumes their queue for over a second.
        while broker.stats("reports")["queues"]["reports"]["overdue"] < len(accounts):
            if time.monotonic() > deadline:
                raise RuntimeError("the demo's reports did not go overdue in time")
            time.sleep(0.05)
        yield
    finally:
        release.set()
        worker.stop()
        broker.close()


def screenshots(directory: Path) -> list[Path]:
    """Fill an embedded server with :func:`demo` and screenshot the overview, the
    "emails" queue page (its scheduled messages, and its activity charts) and the
    Running page into ``directory``."""
    from playwright.sync_api import sync_playwright

    from dramatiq_redisson.embedded import redis_url

    reason = missing_browser()
    if reason:
        raise RuntimeError(reason)
    directory.mkdir(parents=True, exist_ok=True)
    overview, queue = directory / "dashboard-overview.png", directory / "dashboard-queue.png"
    activity, running = directory / "dashboard-activity.png", directory / "dashboard-running.png"
    # An embedded server unless SCREENSHOTS_REDIS_URL names one (never $REDIS_URL: the
    # demo flushes its namespace first).
    with redis_url("SCREENSHOTS_REDIS_URL") as url:
        with demo(url), serve_dashboard(url) as base, sync_playwright() as playwright:
            browser = launch(playwright)
            try:
                page = browser.new_page(viewport={"width": 1280, "height": 800})

                def short_page(path: Path) -> None:
                    """A screenshot of a page that may be short: cut the empty page below it."""
                    bottom = "Math.ceil(document.querySelector('main').getBoundingClientRect().bottom)"
                    height = min(800, page.evaluate(bottom))
                    page.screenshot(path=str(path), clip={"x": 0, "y": 0, "width": 1280, "height": height})

                page.goto(base)
                short_page(overview)
                page.goto(base + "queues/emails")
                page.screenshot(path=str(activity))
                # The scheduled messages, below the charts: their heading at the top.
                page.evaluate("document.querySelector('#scheduled-heading').scrollIntoView()")
                page.screenshot(path=str(queue))
                page.goto(base + "running")
                short_page(running)
            finally:
                browser.close()
    return [overview, queue, activity, running]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.browser", description=__doc__.split("\n\n")[0])
    parser.add_argument("--screenshots", metavar="DIR", type=Path, required=True, help="where to save the PNGs")
    args = parser.parse_args(argv)
    for path in screenshots(args.screenshots):
        print(f"{path} ({path.stat().st_size:,} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
