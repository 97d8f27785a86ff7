"""The helpers Dramatiq's tests import as ``from .common import ...``.

Dramatiq's sdist ships its tests without this module; these are written from how the
tests use them: ``worker`` is a context manager running a worker for the ``with`` block,
the ``skip_*`` names are pytest skip markers used as decorators.
"""

from __future__ import annotations

import os
import platform
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from dramatiq import Broker, Worker


@contextmanager
def worker(broker: Broker, **options: Any) -> Iterator[Worker]:
    """Start a :class:`dramatiq.Worker` on ``broker`` for the block, then stop it.

    ``options`` go to the Worker unchanged (``worker_timeout``, ``worker_threads``,
    ``queues``, ...), so unset ones keep Dramatiq's defaults.
    """
    running = Worker(broker, **options)
    running.start()
    try:
        yield running
    finally:
        running.stop()


#: Skips a test on Windows (signals, fork).
skip_on_windows = pytest.mark.skipif(sys.platform == "win32", reason="not supported on Windows")

#: Skips a test on PyPy (time limits rely on CPython's async exceptions).
skip_on_pypy = pytest.mark.skipif(platform.python_implementation() == "PyPy", reason="not supported on PyPy")

#: Skips a test in CI (long or timing-sensitive rate limiter tests).
skip_in_ci = pytest.mark.skipif(os.getenv("CI") == "true", reason="timing-sensitive; skipped in CI")
