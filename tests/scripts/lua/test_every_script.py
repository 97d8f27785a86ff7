"""Every script the broker runs has its one-script test here (``test_<script>.py``) that
calls it: a new script comes with its contract tested alone, not only through the broker."""

from __future__ import annotations

import re
from pathlib import Path

import dramatiq_redisson

LUA = Path(dramatiq_redisson.__file__).parent / "scripts" / "lua"
HERE = Path(__file__).parent


def test_every_entry_script_has_a_one_script_test_that_runs_it() -> None:
    scripts = sorted(p.stem for p in LUA.glob("*.lua") if not p.name.startswith("_"))
    assert len(scripts) > 20, scripts
    missing = []
    for name in scripts:
        test_file = HERE / f"test_{name}.py"
        if not test_file.exists() or not re.search(rf"""lua\(\s*["']{name}["']\s*\)""", test_file.read_text()):
            missing.append(name)
    assert not missing, (
        f"no one-script test (tests/scripts/lua/test_<script>.py calling lua('<script>')) for: {missing}"
    )
