"""Workflows: chains and groups of Dramatiq messages, nested to any depth, whose state the
broker keeps on its server::

    from dramatiq_redisson.workflows import chain, group

    run = chain(
        fetch.message(url),
        group([resize.message(size) for size in (64, 256, 1024)], on_failure="continue"),
        notify.message(),
    ).run()
    broker.workflows.get(run.id).state  # "running", "done", "failed" or "cancelled"

See ``docs/workflows.md`` for what each piece means, and :mod:`._store` for how it is kept.
"""

from .._settings import DEFAULT_WORKFLOW_RETENTION
from ._compose import FAILURE_POLICIES, chain, group
from ._middleware import WorkflowSteps
from ._states import NodeState, StepState, Workflow, WorkflowState, WorkflowSummary
from ._store import Workflows

__all__ = [
    "DEFAULT_WORKFLOW_RETENTION",
    "FAILURE_POLICIES",
    "NodeState",
    "StepState",
    "Workflow",
    "WorkflowState",
    "WorkflowSteps",
    "WorkflowSummary",
    "Workflows",
    "chain",
    "group",
]
