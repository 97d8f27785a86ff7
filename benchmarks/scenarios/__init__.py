"""The scenarios, one module each. Each returns ``{"data": …, "rows": […], "targets": […]}``
and reports failures (lost or duplicated messages of the Redisson brokers, crashes) through
``ctx.fail``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .._measure import pct
from ._shared import Ctx
from .backlog import backlog_cost
from .burst import burst
from .cluster import cluster
from .field import field
from .fleet import fleet
from .flow import fair_share, flow_cost, priority, rate_limit
from .head_of_line import head_of_line
from .idle import idle_pickup
from .lateness import (
    immediate_paced,
    immediate_paced_otel,
    lateness,
    lateness_paced,
    lateness_paced_otel,
    script_profile,
)
from .memory import memory
from .offer import offer_throughput
from .operations import operations
from .periodic import periodic
from .saturation import saturation
from .script_cost import script_cost
from .work import work_cpu, work_cpu_90, work_io, work_io_90, work_io_immediate
from .workflow import workflow

#: Every scenario, by the name ``python -m benchmarks`` takes, in the order ``all`` runs them.
SCENARIOS: dict[str, Callable[[Ctx], dict[str, Any]]] = {
    "lateness": lateness,
    "lateness-paced": lateness_paced,
    "immediate-paced": immediate_paced,
    "head-of-line": head_of_line,
    "fair-share": fair_share,
    "priority": priority,
    "flow-cost": flow_cost,
    "rate-limit": rate_limit,
    "backlog": backlog_cost,
    "memory": memory,
    "offer": offer_throughput,
    "idle": idle_pickup,
    "burst": burst,
    "saturation": saturation,
    "fleet": fleet,
    "operations": operations,
    "cluster": cluster,
    "periodic": periodic,
    "script-profile": script_profile,
    # Instructions per script call under callgrind (issue 55): needs valgrind, else no rows.
    "script-cost": script_cost,
    "work-io": work_io,
    "work-cpu": work_cpu,
    "work-io-immediate": work_io_immediate,
    "work-io-90": work_io_90,
    "work-cpu-90": work_cpu_90,
    # The tracing middleware on the no-op API (issue 49): lateness-paced and immediate-paced.
    "lateness-paced-otel": lateness_paced_otel,
    "immediate-paced-otel": immediate_paced_otel,
    # Workflows against Dramatiq's group completion callbacks (issue 57).
    "workflow": workflow,
    # Other job queues on the same workload (issue 55): needs the `field` extra.
    "field": field,
}

#: Scenarios ``all`` leaves out: ``field`` drives Celery, huey and rq, which CI (``all
#: --size tiny``) does not install; run it by name (``tox -e field``).
NOT_IN_ALL = frozenset({"field"})

__all__ = ["NOT_IN_ALL", "Ctx", "SCENARIOS", "pct"]
