"""What the demo shop does: which orders it places, their payment deadlines and
which of them get paid, and when. Plain data, importable without a broker."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class OrderPlan:
    """One order of the demo.

    Attributes:
      order: The order number.
      timeout_ms: How long the order may stay unpaid: the delay of its timer.
      pay_after_ms: When (ms after the start) the customer pays, or None if never.
    """

    order: int
    timeout_ms: int
    pay_after_ms: int | None = None

    @property
    def expected_status(self) -> str:
        """``paid`` if the customer pays before the deadline, else ``cancelled``."""
        return "paid" if self.pay_after_ms is not None else "cancelled"


#: Deadlines of 2–4 s, in an order different from the placing order. Payments come
#: at least 0.5 s before the deadline, so every paid order's timer can be removed;
#: the last deadline belongs to an unpaid order, so once all orders are settled
#: every timer is past its due time.
PLAN: tuple[OrderPlan, ...] = (
    OrderPlan(1, 3000),
    OrderPlan(2, 2000, pay_after_ms=1200),
    OrderPlan(3, 3750, pay_after_ms=2900),
    OrderPlan(4, 2500),
    OrderPlan(5, 2250, pay_after_ms=600),
    OrderPlan(6, 3250, pay_after_ms=2000),
    OrderPlan(7, 2750),
    OrderPlan(8, 4000),
)


def expected_counts(plan: tuple[OrderPlan, ...] = PLAN) -> tuple[int, int]:
    """How many orders of ``plan`` should end paid and how many cancelled."""
    paid = sum(1 for p in plan if p.expected_status == "paid")
    return paid, len(plan) - paid
