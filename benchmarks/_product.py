"""The product under test: which ``dramatiq_redisson`` this process (and the processes it
spawns) imports (``--product``), and the record of the machine, the versions and commits."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import redis

from ._base import HERE
from ._server import Server


def use_product(root: Path) -> str:
    """Make this process and every process it spawns import ``dramatiq_redisson`` from
    ``root`` (e.g. a ``git worktree`` frozen at the commit to measure). A temporary
    directory holding only a link to ``root/dramatiq_redisson`` goes first on ``sys.path``
    (``root`` itself would also shadow this ``benchmarks`` package with its own copy),
    ahead of the current directory and of the venv's editable install, whose finder only
    answers what ``sys.path`` does not; and first on ``PYTHONPATH``. Spawned workers get
    this ``sys.path`` from multiprocessing. Returns the file imported."""
    import atexit
    import shutil
    import sys
    import tempfile

    root = root.resolve()
    if not (root / "dramatiq_redisson" / "__init__.py").is_file():
        raise ValueError(f"{root} has no dramatiq_redisson package")
    if "dramatiq_redisson" in sys.modules:
        raise RuntimeError("dramatiq_redisson was imported before --product could take effect")
    shadow = Path(tempfile.mkdtemp(prefix="bench-product-"))
    atexit.register(shutil.rmtree, shadow, ignore_errors=True)
    (shadow / "dramatiq_redisson").symlink_to(root / "dramatiq_redisson", target_is_directory=True)
    sys.path.insert(0, str(shadow))
    os.environ["PYTHONPATH"] = os.pathsep.join([str(shadow), *filter(None, [os.environ.get("PYTHONPATH")])])
    origin = product_origin()
    if origin is None or root not in Path(origin).resolve().parents:
        raise RuntimeError(f"dramatiq_redisson still comes from {origin}, not from {root}")
    return origin


def product_origin() -> str | None:
    """The file ``dramatiq_redisson`` is (or would be) imported from in this process."""
    import importlib.util
    import sys

    module = sys.modules.get("dramatiq_redisson")
    origin = module.__file__ if module is not None else None
    if origin is None:
        spec = importlib.util.find_spec("dramatiq_redisson")
        origin = spec.origin if spec is not None else None
    return str(Path(origin).resolve()) if origin else None


def machine_info(server: Server, product_root: Path | None = None) -> dict[str, Any]:
    """The machine, the versions, and git commits (``+dirty``: uncommitted changes): ``git``,
    the product measured (``product_root`` when given, else this checkout's
    ``dramatiq_redisson``); ``harness_git``, this checkout's ``benchmarks``."""
    import platform
    import subprocess

    import dramatiq

    model = ""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        for line in out.splitlines():
            if line.startswith("Model name"):
                model = line.split(":", 1)[1].strip()
    except Exception:
        pass

    def git(root: Path, path: str) -> str:
        try:
            rev = subprocess.run(
                ["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10
            ).stdout.strip()
            dirty = subprocess.run(
                ["git", "-C", str(root), "status", "--porcelain", "--", path],
                capture_output=True,
                text=True,
                timeout=10,
            ).stdout.strip()
            return rev + ("+dirty" if dirty else "")
        except Exception:
            return ""

    return {
        "git": git(product_root or HERE.parent, "dramatiq_redisson"),
        "harness_git": git(HERE.parent, "benchmarks"),
        "nproc": os.cpu_count(),
        "cpu_model": model,
        "python": platform.python_version(),
        "server": server.version(),
        "dramatiq": dramatiq.__version__,
        "redis_py": redis.__version__,
        "platform": platform.platform(),
        "loadavg_at_start": os.getloadavg(),
    }
