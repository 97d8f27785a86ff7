"""Scripts own their contract (issue 55): each script's header names its ARGV (and the slots
of a fixed reply), ``scripts/_contract.py`` reads it, and every wrapper of ``_calls.py``
passes its arguments by name through it. A name the header lacks, a required one left
out, or an optional one skipped is a TypeError before anything is sent; a header that
breaks the grammar fails when it is read."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from dramatiq_redisson.scripts import _calls
from dramatiq_redisson.scripts._contract import contract, parse_contract

LUA = Path(_calls.__file__).parent / "lua"
SCRIPTS = sorted(p.stem for p in LUA.glob("*.lua"))

HEADER = """-- demo: a script
--
-- KEYS[1]  ready
--
-- ARGV[1]  count  how many
-- ARGV[2]  token  who
-- ARGV[3]  clock?  optional: the caller's clock
-- ARGV[4]  lane_prefix +lanes  with the +lanes keys
-- ARGV[5]  ring_prefix +lanes
-- ARGV[6]  idle +idle
-- ARGV[7..] ids  the rest
--
-- returns: {moved, next_due}
"""


def test_a_header_gives_the_names_the_order_the_groups_and_the_reply_slots() -> None:
    demo = parse_contract(HEADER, "demo")
    assert demo.names == ("count", "token", "clock", "lane_prefix", "ring_prefix", "idle", "ids")
    assert (demo.required, demo.tail, demo.returns) == (2, True, ("moved", "next_due"))
    assert demo.groups == {"lane_prefix": "lanes", "ring_prefix": "lanes", "idle": "idle"}


@pytest.mark.parametrize(
    ("given", "argv"),
    [
        ({"count": 3, "token": "t"}, [3, "t"]),
        ({"token": "t", "count": 3, "clock": "9"}, [3, "t", "9"]),  # the header's order, not the call's
        ({"count": 3, "token": "t", "clock": "", "ids": ["a", "b"]}, [3, "t", "", "a", "b"]),
        # a group left out moves the later arguments up; one given comes whole
        ({"count": 3, "token": "t", "clock": "", "idle": "idle"}, [3, "t", "", "idle"]),
        (
            {"count": 3, "token": "t", "clock": "", "lane_prefix": "L", "ring_prefix": "R", "ids": ["a"]},
            [3, "t", "", "L", "R", "a"],
        ),
    ],
)
def test_arguments_by_name_go_in_the_header_s_order(given: dict[str, object], argv: list[object]) -> None:
    assert parse_contract(HEADER, "demo").argv(**given) == argv


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"count": 3, "token": "t", "clok": "9"}, "demo.lua takes no argument clok"),
        ({"count": 3}, "ARGV 'token' is missing (required"),
        ({"count": 3, "token": "t", "ids": ["a"]}, "ARGV 'clock' is missing (left out before a later one given"),
        ({"count": 3, "token": "t", "clock": "", "lane_prefix": "L"}, "ARGV 'ring_prefix' of group +lanes is missing"),
    ],
)
def test_a_call_that_breaks_the_contract_is_refused_before_it_is_sent(given: dict[str, object], message: str) -> None:
    with pytest.raises(TypeError, match=re.escape(message)):
        parse_contract(HEADER, "demo").argv(**given)


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        ("-- ARGV[1]  count\n-- ARGV[3]  token\n", r"ARGV\[3\] is not argument 2"),
        ("-- ARGV[1]  count\n-- ARGV[2]  count\n", "used twice"),
        ("-- ARGV[1]  clock?\n-- ARGV[2]  count\n", "required but follows an optional one"),
        ("-- ARGV[1..] ids\n-- ARGV[2]  count\n", "follows the tail"),
        ("-- ARGV[1]  count? +lanes\n", "neither optional nor a tail"),
        ('-- ARGV[1]  "0": leave it\n', "an ARGV line that is not"),
        ("-- ARGV[1]  Count\n", "an ARGV line that is not"),
        ("-- KEYS[1]  ready\n", "must list its ARGV, or say '-- ARGV none'"),
    ],
)
def test_a_header_that_breaks_the_grammar_fails_when_read(lines: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_contract(f"-- bad\n{lines}\nreturn 1\n", "bad")


def test_the_header_ends_at_the_first_line_that_is_not_a_comment() -> None:
    text = "-- ok\n-- ARGV none\nlocal x = 1\n-- ARGV[1]  late  (in the body: not read)\n"
    assert parse_contract(text, "ok").names == ()


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_script_declares_its_arguments(script: str) -> None:
    declared = contract(script)
    assert len(set(declared.names)) == len(declared.names)


def _wrapper_calls() -> list[tuple[str, str]]:
    """(wrapper, how its ARGV is made) for every call of the runner in ``_calls.py``."""
    tree = ast.parse(Path(_calls.__file__).read_text())
    runs = {"_run", "_run_idempotent", "_run_resending", "_run_waiting", "_wait_checked", "stream"}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef):
            for call in ast.walk(node):
                if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr in runs:
                    found.append((node.name, ast.unparse(call.args[-1] if call.func.attr != "stream" else call)))
    return found


def test_every_wrapper_passes_its_arguments_by_name_through_the_contract() -> None:
    # Every ARGV the runner gets is made by a contract (a name bound to one, or a call of
    # .argv(...) / _enqueue_args), never a tuple or list written positionally.
    positional = [
        (name, made)
        for name, made in _wrapper_calls()
        if made.startswith(("(", "[")) and "argv(" not in made and "_enqueue_args(" not in made
    ]
    assert not positional, positional
    assert {name for name, _ in _wrapper_calls()} >= {"transfer", "fetch", "ack", "offer_one", "enqueue", "offer"}
