"""The worker app of the workflow fault tests (``test_workflow_faults.py``):
``python -m dramatiq tests.workflows.workflow_fault_app:broker``.

It is the fault suite's ``fault_app`` (its broker on ``FAULTS_BROKER_URL`` with the
suite's heartbeat and maintenance settings, its queue ``FAULTS_QUEUE``, its ``ready``
record: see ``tests/harness/faults/fault_app.py``), so it runs with the environment of
``procs.subprocess_env``, which puts ``tests/harness/faults`` on ``sys.path``. It adds the
three actors of ``chain(wf_start(), group([wf_member(i, work_ms) ...]), wf_complete())``.

Every run records ``start`` and then ``finish`` on the record server (``fault_common``'s
records, stamped with the record server's clock): ``seq`` the member's index (0 for the
other two steps), ``attempt`` the message's ``retries``, the pid, and ``extra`` =
``"<actor>,<run id>"``. The ``finish`` of ``wf_complete`` adds ``,<the results it got, as
JSON>``. A run with a ``start`` and no ``finish`` was cut short (its process was killed).
"""

from __future__ import annotations

import itertools
import json
import os
import time
from typing import Any

import dramatiq
from dramatiq.middleware import CurrentMessage
from fault_app import QUEUE, broker, stamp  # noqa: F401 - broker: the CLI's target
from fault_common import FINISH, START

#: What ``wf_start`` returns and each member gets appended to its arguments.
GO = "go"

_run_ids = itertools.count()


def member_result(i: int) -> str:
    """What member ``i`` returns (the tests expect the list of these, in order)."""
    return f"member-{i:04d}"


def _started(actor: str, seq: int) -> tuple[int, int, int, str]:
    """Record the start of a run; returns the record's fields (``seq``, attempt, pid,
    ``extra``) for its ``finish``."""
    message: Any = CurrentMessage.get_current_message()
    attempt = int(message.options.get("retries", 0)) if message is not None else 0
    pid = os.getpid()
    fields = (seq, attempt, pid, f"{actor},{pid}.{next(_run_ids)}")
    stamp()(START, *fields)
    return fields


def _finished(fields: tuple[int, int, int, str], payload: str = "") -> None:
    seq, attempt, pid, extra = fields
    stamp()(FINISH, seq, attempt, pid, f"{extra},{payload}" if payload else extra)


@dramatiq.actor(queue_name=QUEUE, max_retries=0)
def wf_start() -> str:
    _finished(_started("wf_start", 0))
    return GO


@dramatiq.actor(queue_name=QUEUE, max_retries=0)
def wf_member(i: int, work_ms: int, go: str) -> str:
    """A member: works ``work_ms`` (so that a fault lands while members run) and returns
    :func:`member_result`. ``go``: ``wf_start``'s result, passed on by the chain."""
    run = _started("wf_member", i)
    if go != GO:
        raise ValueError(f"member {i} got {go!r} from wf_start, not {GO!r}")
    time.sleep(work_ms / 1000)
    _finished(run)
    return member_result(i)


@dramatiq.actor(queue_name=QUEUE, max_retries=0)
def wf_complete(results: list[str]) -> int:
    """The completion: records the group's results it got and returns how many."""
    _finished(_started("wf_complete", 0), json.dumps(results, separators=(",", ":")))
    return len(results)
