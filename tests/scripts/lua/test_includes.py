"""The shared Lua functions (``scripts/lua/include/<name>.lua``): one named function per
file, named after it; every one used by some script; every function or constant a script
uses written into it; and the expansion's rules (each include once, in a body only where
it is seen)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import dramatiq_redisson
from dramatiq_redisson.scripts import _runner
from dramatiq_redisson.scripts._runner import expand_includes, load_source

LUA = Path(dramatiq_redisson.__file__).parent / "scripts" / "lua"
INCLUDES = sorted((LUA / "include").glob("*.lua"))
SCRIPTS = sorted(LUA.glob("*.lua"))

#: A statement at the start of a line of an include file: its one function, a local
#: constant (or the cache of a function made on first use), or the function's end.
_FUNCTION = re.compile(r"^local function (\w+)\(", re.MULTILINE)
_TOP = re.compile(r"^(?!--|end$|local function |local [A-Za-z_]+ = |\s|$).*", re.MULTILINE)
_CONSTANT = re.compile(r"^local ([A-Za-z_]+) = ", re.MULTILINE)


def _code(text: str) -> str:
    return re.sub(r"--[^\n]*", "", text)


def test_each_include_defines_one_top_level_function_named_after_its_file() -> None:
    assert len(INCLUDES) > 30, INCLUDES
    wrong = {}
    for path in INCLUDES:
        text = path.read_text()
        functions = re.findall(r"^\s*local function (\w+)", text, re.MULTILINE)
        if functions != [path.stem] or _FUNCTION.findall(text) != [path.stem]:
            wrong[path.name] = functions
        stray = _TOP.findall(_code(text))
        if stray:
            wrong[path.name] = stray
    assert not wrong, f"each include file defines exactly one function, named after the file: {wrong}"


def test_every_include_is_used_by_some_script() -> None:
    expanded = [load_source(p.stem).decode() for p in SCRIPTS]
    unused = [p.stem for p in INCLUDES if not any(f"local function {p.stem}(" in text for text in expanded)]
    assert not unused, f"included by no script: {unused}"


def _provider() -> dict[str, tuple[str, re.Pattern[str]]]:
    """Each name an include defines -> the include, and how a use of it reads: a call of
    its function (or the function as a value, ``= name``), a constant's name."""
    provides: dict[str, tuple[str, re.Pattern[str]]] = {}
    for path in INCLUDES:
        uses = [(path.stem, rf"(?<![\w.]){path.stem}\s*\(|=\s*{path.stem}\b")]
        uses += [(constant, rf"(?<![\w.]){constant}\b") for constant in _CONSTANT.findall(path.read_text())]
        for name, use in uses:
            assert name not in provides, f"{name} is defined by both {provides[name][0]} and {path.stem}"
            provides[name] = (path.stem, re.compile(use))
    return provides


def _needed(text: str) -> set[str]:
    """The includes whose names ``text`` (comments dropped) uses."""
    return {include for include, use in _provider().values() if use.search(text)}


@pytest.mark.parametrize("script", [p.stem for p in SCRIPTS])
def test_a_script_has_every_shared_name_it_uses_written_in(script: str) -> None:
    # A name that is not written in would be a global at run time: an error in Redis, and
    # only on the path that reaches it.
    text = _code(load_source(script).decode())
    written = set(re.findall(r"^\s*local function (\w+)\(", text, re.MULTILINE))
    missing = _needed(text) - written
    assert not missing, f"{script}.lua uses these without including them: {sorted(missing)}"


def test_expansion_writes_each_include_once_and_is_the_same_every_time() -> None:
    text = load_source("transfer")
    assert text.count(b"local function key_len(") == 1
    assert b"-- (key_len.lua is included above)" in text
    assert load_source("transfer") == text
    assert b"-- include:" not in text.replace(b"-- (", b"")


def test_an_include_seen_only_inside_a_body_cannot_be_named_outside_it(monkeypatch: pytest.MonkeyPatch) -> None:
    files = {
        "lazy.lua": b"local function lazy()\n    -- include: inner.lua\n    return inner\nend\n",
        "inner.lua": b"local function inner()\nend\n",
    }
    monkeypatch.setattr(_runner, "read_include", lambda name: files[name])
    # Inside the body of lazy(): written in there, indented.
    assert b"    local function inner()" in expand_includes(b"-- include: lazy.lua\n")
    # Named at the top first, then inside: the body sees the top one.
    assert expand_includes(b"-- include: inner.lua\n-- include: lazy.lua\n").count(b"local function inner(") == 1
    # Seen inside the body first, then named outside it: it would not be in scope there.
    with pytest.raises(ValueError, match="inside the body of lazy.lua"):
        expand_includes(b"-- include: lazy.lua\n-- include: inner.lua\n")


def test_the_checks_catch_a_second_function_and_a_missing_include(tmp_path: Path) -> None:
    two = "local function a()\nend\n\nlocal function b()\nend\n"
    assert _FUNCTION.findall(two) == ["a", "b"]
    assert _TOP.findall(_code("local function a()\nend\nredis.call('GET', 'x')\n")) == ["redis.call('GET', 'x')"]
    assert not _TOP.findall(_code("-- doc\nlocal CHUNK = 1000\n\nlocal function a()\n    return 1\nend\n"))
    # A script that calls a shared function it never includes is caught.
    assert _needed(_code("local x = stored_key(y) -- wake(idle)\nlocal wake = 1\n")) == {"stored_key"}
    assert _needed("for i = 1, #ids, CHUNK do") == {"variadic"}
