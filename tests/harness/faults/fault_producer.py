"""The producer of the fault suite: ``python -m fault_producer`` (same environment as
``fault_app``, plus the plan below).

Sends ``FAULTS_N`` messages at ``FAULTS_RATE`` per second, paced on a fixed schedule (a
slow send does not shift the later ones): ``FAULTS_IMMEDIATE`` of them immediate, the rest
delayed uniformly in ``FAULTS_DELAY_MIN_MS``..``FAULTS_DELAY_MAX_MS``; ``FAULTS_FAIL``
of all fail once. The plan comes from ``FAULTS_SEED``. With ``FAULTS_FLOW=1`` it first
sets the queue's limits (``fault_app.FLOW_LIMITS``) and sends each message in
one of ``FLOW_GROUPS`` groups at a priority, in turn.

Before each send it records ``sent`` (record-server clock, delay, fail flag), so the
message's due time is at most that time + delay on the record server's clock (the broker
reads its own server's clock later, during the send). A send that raises is recorded as
``refused`` and the producer goes on: an operator's producer would report the error to
its caller, and the message is not counted as lost.
"""

from __future__ import annotations

import os
import random
import sys
import time

from fault_app import FLOW, FLOW_GROUPS, FLOW_LIMITS, FLOW_MAX_PRIORITY, broker, work
from fault_common import PRODUCER_DONE, REFUSED, SENT, Stamper


def main() -> int:
    count = int(os.environ["FAULTS_N"])
    rate = float(os.environ["FAULTS_RATE"])
    immediate = float(os.environ.get("FAULTS_IMMEDIATE", "0.2"))
    fail = float(os.environ.get("FAULTS_FAIL", "0.1"))
    delay_min = int(os.environ.get("FAULTS_DELAY_MIN_MS", "1000"))
    delay_max = int(os.environ.get("FAULTS_DELAY_MAX_MS", "5000"))
    rng = random.Random(int(os.environ.get("FAULTS_SEED", "1")))
    stamp = Stamper(os.environ["FAULTS_RECORD_URL"], os.environ["FAULTS_PREFIX"])
    pid = os.getpid()
    refused = 0
    if FLOW:
        broker.limits.set(work.queue_name, **FLOW_LIMITS)
    started = time.monotonic()
    for seq in range(count):
        delay = 0 if rng.random() < immediate else rng.randint(delay_min, delay_max)
        fail_once = rng.random() < fail
        pause = started + seq / rate - time.monotonic()
        if pause > 0:
            time.sleep(pause)
        stamp(SENT, seq, 0, pid, f"{delay},{int(fail_once)}")
        try:
            flow = {"group_key": f"g{seq % FLOW_GROUPS}", "broker_priority": seq % (FLOW_MAX_PRIORITY + 1)}
            work.send_with_options(args=(seq, fail_once), delay=delay or None, **(flow if FLOW else {}))
        except Exception as e:  # noqa: BLE001 - every refusal is counted, none stops us
            refused += 1
            stamp(REFUSED, seq, 0, pid, type(e).__name__)
            print(f"send {seq} refused: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
    stamp(PRODUCER_DONE, count, 0, pid, str(refused))
    return 0


if __name__ == "__main__":
    sys.exit(main())
