"""The order-timeout demo: place orders with cancel-if-unpaid timers, pay some of them
(cancelling their timers), let the others time out, and print what happened when.

Imports :mod:`example_app.tasks`, which builds the broker from ``$REDIS_URL``: set it
before importing this module (``python -m example_app`` does).
"""

from __future__ import annotations

import sys
import time
from typing import TextIO
from uuid import uuid4

import dramatiq
from dramatiq.logging import get_logger

from .orders import CANCELLED, PAID, Event, OrderStore
from .scenario import PLAN, OrderPlan
from .tasks import QUEUE_NAME, broker, cancel_if_unpaid

#: How long (ms) to keep listening after the last due time, for stray timers.
GRACE_MS = 300

#: How long (ms) past the last due time the demo waits before giving up.
GIVE_UP_MS = 5000

#: Longest wait (s) for events between two looks at the clock.
POLL_S = 0.2

logger = get_logger(__name__)


class Demo:
    """One run of the scenario against the broker of :mod:`example_app.tasks`.

    Parameters:
      plan: The orders to place and pay.
      out: Where the timeline goes.
    """

    def __init__(self, plan: tuple[OrderPlan, ...] = PLAN, out: TextIO = sys.stdout) -> None:
        self.logger = get_logger(__name__, type(self))
        self.plan = {p.order: p for p in plan}
        self.out = out
        self.run_id = uuid4().hex[:12]
        self.store = OrderStore(broker.client, self.run_id)
        self.queue = broker.delayed_queue(QUEUE_NAME)
        self.start_ms = 0
        self.timers: dict[int, str] = {}
        self.due: dict[int, int] = {}
        self.settled: set[int] = set()
        self.removed = 0
        self.fired = 0
        self.lateness: list[int] = []
        self.errors: list[str] = []

    # -- the scenario -------------------------------------------------------------

    def run(self) -> int:
        """Play the scenario; returns the exit code (0 if every order ended right)."""
        pool = broker.client.connection_pool.connection_kwargs
        paid, total = sum(1 for p in self.plan.values() if p.pay_after_ms is not None), len(self.plan)
        self.say(
            f"Shop demo, run {self.run_id}: {total} orders, {paid} of them get paid; "
            f"server {pool.get('host')}:{pool.get('port')}/{pool.get('db') or 0}, queue {QUEUE_NAME!r}"
        )
        self.start_ms = self.store.now_ms()
        started = time.monotonic()
        self.place_orders()
        self.handle_events(self.store.pop_events())
        self.show_pending()
        self.follow(started)
        self.check()
        return self.summary()

    def place_orders(self) -> None:
        """Create every order and send its cancel-if-unpaid timer."""
        for p in self.plan.values():
            self.store.create(p.order)
            message = cancel_if_unpaid.send_with_options(args=(self.run_id, p.order), delay=p.timeout_ms)
            self.timers[p.order] = message.message_id
            self.store.set_timer(p.order, message.message_id)
            self.store.log("placed", p.order, timeout_ms=p.timeout_ms, message_id=message.message_id)

    def show_pending(self) -> None:
        """List the scheduled timers of this run with their due times."""
        entries = [(due, m) for due, m in self.queue.read_all() if m.args and m.args[0] == self.run_id]
        self.say(f"delayed_queue({QUEUE_NAME!r}).size() = {self.queue.size()}; this run's timers, earliest first:")
        for due, message in entries:
            order = int(message.args[1])
            self.due[order] = due
            self.say(f"    due {self.rel(due)}  order #{order}  {message.actor_name}  message {message.message_id}")
        for order in self.timers.keys() - self.due.keys():
            self.errors.append(f"order #{order}: timer not listed by read_all() right after placing")

    def pay(self, order: int) -> None:
        """Pay an order and, if that settled it, remove its timer from the delayed queue."""
        if not self.store.pay(order):
            return
        removed = self.queue.remove(self.timers[order])
        self.store.log("timer_removed", order, ok=removed, message_id=self.timers[order])

    def follow(self, started: float) -> None:
        """Make the payments on time and print events until every order is settled and
        every timer is past due (plus :data:`GRACE_MS`), or the demo gives up."""
        payments = sorted((p.pay_after_ms, p.order) for p in self.plan.values() if p.pay_after_ms is not None)
        last_due = max(self.due.values(), default=self.start_ms + max(p.timeout_ms for p in self.plan.values()))
        while True:
            elapsed_ms = (time.monotonic() - started) * 1000
            while payments and payments[0][0] <= elapsed_ms:
                self.pay(payments.pop(0)[1])
            now = self.store.now_ms()
            if not payments and len(self.settled) == len(self.plan) and now >= last_due + GRACE_MS:
                break
            if now >= last_due + GIVE_UP_MS:
                self.errors.append(f"gave up {GIVE_UP_MS} ms after the last due time")
                break
            wait = POLL_S if not payments else min(POLL_S, max(0.001, (payments[0][0] - elapsed_ms) / 1000))
            self.handle_events(self.store.pop_events(timeout=wait))
        self.handle_events(self.store.pop_events())

    # -- events -------------------------------------------------------------------

    def handle_events(self, events: list[Event]) -> None:
        for event in events:
            self.handle(event)

    def handle(self, event: Event) -> None:
        """Print one event on the timeline and keep the score."""
        n = event.order
        if event.kind == "placed":
            data = event.data or {}
            self.say(f"order #{n} placed, pay within {data['timeout_ms'] / 1000:.2f} s", event.t)
        elif event.kind == "paid" and event.ok:
            self.settled.add(n)
            self.say(f"order #{n} paid", event.t)
        elif event.kind == "paid":
            self.say(f"order #{n} payment refused: order already {event.seen}", event.t)
        elif event.kind == "timer_removed":
            self.removed += event.ok
            verdict = "yes" if event.ok else "NO, it already left the delayed queue"
            self.say(f"order #{n} timer cancelled: {verdict} (remove() -> {event.ok})", event.t)
            if not event.ok:
                self.errors.append(f"order #{n}: paid {self.rel(event.t)} but its timer could not be removed")
        elif event.kind == "timer_fired":
            self.fired += 1
            late = self.late(n, event.t)
            if event.ok:
                self.settled.add(n)
                self.say(f"order #{n} timer fired -> order cancelled ({late})", event.t)
            else:
                self.say(f"order #{n} timer fired, order already {event.seen}: nothing to do ({late})", event.t)
            if event.seen == PAID:
                self.errors.append(f"order #{n}: timer fired for a paid order")
        else:  # pragma: no cover - only the kinds above are logged
            self.logger.warning("Unknown event %r.", event)

    def late(self, order: int, fired_ms: int) -> str:
        due = self.due.get(order)
        if due is None:
            return "due time unknown"
        lateness = fired_ms - due
        self.lateness.append(lateness)
        if lateness < 0:
            self.errors.append(f"order #{order}: timer fired {-lateness} ms before its due time")
        return f"due {self.rel(due)}, late {lateness} ms"

    # -- the verdict --------------------------------------------------------------

    def check(self) -> None:
        """Compare every order's final state with the plan; no timer may be left."""
        for p in self.plan.values():
            status = self.store.status(p.order)
            if status != p.expected_status:
                self.errors.append(f"order #{p.order}: ended {status}, expected {p.expected_status}")
            if self.queue.contains(self.timers[p.order]):
                self.errors.append(f"order #{p.order}: timer still scheduled at the end")

    def summary(self) -> int:
        """Print the errors and the summary line; returns the exit code."""
        statuses = [self.store.status(order) for order in self.plan]
        paid, cancelled = statuses.count(PAID), statuses.count(CANCELLED)
        for error in self.errors:
            self.say(f"ERROR {error}")
        late = f"{max(self.lateness)}" if self.lateness else "n/a"
        verdict = "OK" if not self.errors else "FAILED"
        self.say(
            f"SUMMARY orders={len(self.plan)} paid={paid} cancelled={cancelled} timers_removed={self.removed} "
            f"timers_fired={self.fired} max_late_ms={late} errors={len(self.errors)} -> {verdict}"
        )
        return 0 if not self.errors else 1

    def cleanup(self) -> None:
        """Drop this run's keys and any of its timers still scheduled."""
        for message_id in self.timers.values():
            self.queue.remove(message_id)
        self.store.delete(list(self.plan))

    # -- output -------------------------------------------------------------------

    def rel(self, t_ms: int) -> str:
        """A server time as seconds since the start of the run."""
        return f"+{(t_ms - self.start_ms) / 1000:.3f}s"

    def say(self, text: str, t_ms: int | None = None) -> None:
        prefix = f"{self.rel(t_ms):>9}  " if t_ms is not None else ""
        print(prefix + text, file=self.out, flush=True)


def run(plan: tuple[OrderPlan, ...] = PLAN, out: TextIO = sys.stdout) -> int:
    """Run the demo with an in-process worker; returns the exit code."""
    worker = dramatiq.Worker(broker, worker_threads=2, worker_timeout=100)
    worker.start()
    demo = Demo(plan, out)
    try:
        return demo.run()
    finally:
        worker.stop()
        demo.cleanup()
        broker.client.close()
