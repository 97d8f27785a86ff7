"""What `pip install` puts into site-packages: the wheel holds dramatiq_redisson only (with
its Lua scripts); the sdist also carries the demo (example_app) and the docs."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

_SDIST = "import sys; from setuptools import build_meta; print(build_meta.build_sdist(sys.argv[1]))"


def test_the_wheel_installs_only_the_package_and_the_sdist_ships_the_demo(tmp_path: Path) -> None:
    # Build from a copy of the tree (a build writes egg-info and build/ next to the sources)
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "MANIFEST.in", "tox.ini"):
        shutil.copy(ROOT / name, src / name)
    for name in ("dramatiq_redisson", "example_app", "docs"):
        shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
    out = tmp_path / "dist"
    out.mkdir()
    # The wheel as pip builds it for `pip install` (isolated build with the declared backend)
    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(src)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    (wheel_name,) = [p.name for p in out.glob("*.whl")]
    result = subprocess.run(
        [sys.executable, "-c", _SDIST, str(out)], cwd=src, capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr[-3000:]
    sdist_name = result.stdout.split()[-1]

    with zipfile.ZipFile(out / wheel_name) as wheel:
        top = {name.split("/")[0] for name in wheel.namelist()}
        names = set(wheel.namelist())
    assert {t for t in top if not t.endswith((".dist-info", ".data"))} == {"dramatiq_redisson"}
    assert "dramatiq_redisson/scripts/lua/transfer.lua" in names
    assert "dramatiq_redisson/py.typed" in names
    # Every module and script of the source tree, sub-packages included (cli/, dashboard/)
    tree = {
        path.relative_to(src).as_posix()
        for path in (src / "dramatiq_redisson").rglob("*")
        if path.suffix in (".py", ".lua") and "__pycache__" not in path.parts
    }
    assert tree <= names, sorted(tree - names)
    # The dashboard's templates and static files, without which its pages cannot render
    assert {
        "dramatiq_redisson/dashboard/templates/queue.html",
        "dramatiq_redisson/dashboard/static/style.css",
        "dramatiq_redisson/dashboard/static/app.js",
    } <= names

    with tarfile.open(out / sdist_name) as sdist:
        members = {"/".join(m.split("/")[1:]) for m in sdist.getnames()}
    assert {"example_app/__main__.py", "example_app/tasks.py", "docs/security.md"} <= members
    assert "dramatiq_redisson/scripts/lua/transfer.lua" in members
    assert "dramatiq_redisson/dashboard/templates/base.html" in members
