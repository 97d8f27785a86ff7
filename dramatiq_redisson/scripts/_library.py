"""The hot consumer scripts as one function library (``FUNCTION LOAD`` once, ``FCALL``
per call), on servers that have functions (Redis >= 7.0, Valkey).

Why (issue 55): an EVALSHA runs the whole script text on every call, its includes'
``local function`` definitions too, so a call pays for defining every shared function it
might use before its first command. A function library defines them once, when it is
loaded. Counted with callgrind on Valkey 9.1 (``python -m benchmarks script-cost``), a
call of transfer.lua that moves one message costs about 9 % fewer instructions as
``FCALL``, ack.lua about 15 % and fetch.lua about 4 %.

Only :data:`FUNCTION_SCRIPTS` run this way: scripts whose first write never grows memory
(each header's Memory paragraph), so that the ``allow-oom`` flag changes nothing of what
they may do on a server at its ``maxmemory`` limit: an EVAL script is refused there only
at a first write that grows memory, and these have none. (A function without that flag
is refused before it runs, and one with it is never refused: the producer's scripts,
which must be refused there with nothing written, keep EVALSHA.)

The library's name and its functions' names end with a digest of its text, so processes
of two releases on one server (a rolling deploy) each call their own code.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from ._runner import expand_includes, read_script, split_includes

#: The scripts that run as functions where the server has them (see the module's docstring).
FUNCTION_SCRIPTS: tuple[str, ...] = ("transfer", "fetch", "ack")


@dataclass(frozen=True)
class Library:
    """A function library: its ``name``, its ``source`` (the text FUNCTION LOAD takes)
    and ``functions``: script name -> the function that runs it."""

    name: str
    source: bytes
    functions: Mapping[str, str]


def build_library(convert: Callable[[bytes], bytes] = lambda text: text) -> Library:
    """The library of :data:`FUNCTION_SCRIPTS`; ``convert``: what a topology makes of a
    script's text (its ``script_source``).

    Each script becomes a ``do ... end`` block: its includes, written in as for EVAL
    (:func:`expand_includes`), then its text as the body of a function of ``KEYS`` and
    ``ARGV``, registered with the ``allow-oom`` flag. The includes of each block are
    defined once, at load, and are that block's alone."""
    blocks = []
    for name in FUNCTION_SCRIPTS:
        included, body = split_includes(read_script(name))
        blocks.append((name, expand_includes(included), body))
    digest = hashlib.sha1(b"\0".join(convert(part) for block in blocks for part in block[1:])).hexdigest()[:12]
    library = f"dramatiq_redisson_{digest}"
    functions = {name: f"dramatiq_redisson_{name}_{digest}" for name in FUNCTION_SCRIPTS}
    parts = [f"#!lua name={library}".encode()]
    for name, includes, body in blocks:
        parts.append(
            b"do\n"
            + includes
            + b"\nlocal function call(KEYS, ARGV)\n"
            + body
            + b"\nend\nredis.register_function{function_name = '"
            + functions[name].encode()
            + b"', callback = call, flags = {'allow-oom'}}\nend"
        )
    return Library(library, convert(b"\n".join(parts)), functions)
