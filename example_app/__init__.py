"""Example app for dramatiq-redisson: order timeouts on a delayed queue.

An online shop places orders; each gets a "cancel if unpaid" timer, a message sent
with ``delay=``. Paying an order removes its timer from the delayed queue
(:meth:`dramatiq_redisson.DelayedQueue.remove`); unpaid orders are cancelled by the
actor when the timer fires. Run the demo with ``python -m example_app``; run workers
for the actor with ``dramatiq example_app.tasks:broker``.

Modules:
  scenario: the orders and payments of the demo (plain data).
  orders: order state and the run's event log in Redis.
  tasks: the broker (from ``$REDIS_URL``) and the ``cancel_if_unpaid`` actor.
  demo: the demo itself.

Importing this package does not build a broker; importing ``tasks`` or ``demo`` does.
"""
