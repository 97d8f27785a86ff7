"""A real headless Chromium and a real dashboard server, for the browser tests and the
README's screenshots.

Run ``python -m tests.browser --screenshots docs/img`` to fill an embedded server with a
demo (queues, scheduled and ready messages, dead letters of real failures) and save
``dashboard-overview.png`` and ``dashboard-queue.png`` there.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from dramatiq_redisson.embedded import free_loopback_port

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Playwright

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
        return "playwright is not installed: pip install 'dramatiq-redisson[test]'"
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


@contextlib.contextmanager
def demo(redis_url: str) -> Iterator[None]:
    """A realistic namespace for as long as the block runs: three queues, about 2,000
    scheduled messages of four actors with varied arguments and due times, ready ones, an
    overdue backlog on a queue no worker consumes, and dead letters of real failures (with
    their tracebacks) from the worker of "billing", which keeps running."""
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
    logging.getLogger("dramatiq").setLevel(logging.CRITICAL)  # the failures are expected
    worker = dramatiq.Worker(broker, queues={"billing"}, worker_threads=2, worker_timeout=100)
    worker.start()
    try:
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
        worker.stop()
        broker.close()


def screenshots(directory: Path) -> list[Path]:
    """Fill an embedded server with :func:`demo` and screenshot the overview and the
    "emails" queue page into ``directory``."""
    from playwright.sync_api import sync_playwright

    from dramatiq_redisson.embedded import redis_url

    reason = missing_browser()
    if reason:
        raise RuntimeError(reason)
    directory.mkdir(parents=True, exist_ok=True)
    overview, queue = directory / "dashboard-overview.png", directory / "dashboard-queue.png"
    # An embedded server unless SCREENSHOTS_REDIS_URL names one (never $REDIS_URL: the
    # demo flushes its namespace first).
    with redis_url("SCREENSHOTS_REDIS_URL") as url:
        with demo(url), serve_dashboard(url) as base, sync_playwright() as playwright:
            browser = launch(playwright)
            try:
                page = browser.new_page(viewport={"width": 1280, "height": 800})
                page.goto(base)
                # The overview is short: cut the empty page below it.
                height = page.evaluate("Math.ceil(document.querySelector('main').getBoundingClientRect().bottom)")
                page.screenshot(path=str(overview), clip={"x": 0, "y": 0, "width": 1280, "height": min(800, height)})
                page.goto(base + "queues/emails")
                page.screenshot(path=str(queue))
            finally:
                browser.close()
    return [overview, queue]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.browser", description=__doc__.split("\n\n")[0])
    parser.add_argument("--screenshots", metavar="DIR", type=Path, required=True, help="where to save the PNGs")
    args = parser.parse_args(argv)
    for path in screenshots(args.screenshots):
        print(f"{path} ({path.stat().st_size:,} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
