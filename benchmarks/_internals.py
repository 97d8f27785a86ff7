"""Everything the harness takes from the product's private modules, in one place.

``python -m benchmarks.ab --ref REV`` runs this tree's harness on an older
``dramatiq_redisson`` (``--product``), whose private modules may sit elsewhere: issue 48
moved ``_script_runner`` to ``scripts._runner``, ``_scripts`` to ``scripts._calls``,
``_paging`` and ``_delayed_queue`` into ``admin``, ``_limits`` to ``_tuning``. Each name
below lists its module's paths, newest first; the first that exists in the product's own
package directory is imported. Only there: the venv's editable install would answer a
module path the product lacks with this checkout's module (see ``_brokers.add_tracing``).

Names are looked up on first use (``from ._internals import TransferDuty``), never when
this module is imported: ``--product`` must take effect before the product is imported.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType
from typing import Any

from ._base import HERE

_RUNNER = ("scripts._runner", "_script_runner")
_CALLS = ("scripts._calls", "_scripts")

#: name -> its module's paths in the product, newest first (relative to the package).
WHERE: dict[str, tuple[str, ...]] = {
    "expand_includes": _RUNNER,
    "load_source": _RUNNER,
    "TransferResult": _CALLS,
    "RedissonConsumer": ("_consumer",),
    "TransferDuty": ("_transfer_duty",),
    "queue_json": ("_message",),
    "encode_scheduled": ("_message",),
    "next_sort_keys": ("_ids",),
    "BULK_STEP": ("admin._paging", "_paging"),
    "encode_cursor": ("admin._delayed_queue", "_delayed_queue"),
    "COMPACT_SLACK": ("_tuning", "_limits"),
    "COMPACT_STEP": ("_tuning", "_limits"),
    "TRIM_BUDGET": ("_tuning", "_limits"),
}

#: The folder of the product's Lua scripts, newest first.
LUA_FOLDERS = ("scripts/lua", "lua")


def product_dir() -> Path:
    """The directory of the ``dramatiq_redisson`` package this process imports."""
    import dramatiq_redisson

    return Path(dramatiq_redisson.__file__).resolve().parent


def module(*paths: str) -> ModuleType:
    """The first of the product's modules ``paths`` (relative to the package) that exists
    in the product's own directory."""
    root = product_dir()
    for path in paths:
        parts = path.split(".")
        if root.joinpath(*parts).with_suffix(".py").is_file() or root.joinpath(*parts, "__init__.py").is_file():
            return importlib.import_module(f"dramatiq_redisson.{path}")
    raise ImportError(f"the product at {root} has none of {', '.join(paths)}")


def lua_dir() -> Path:
    """The product's folder of Lua scripts."""
    root = product_dir()
    for folder in LUA_FOLDERS:
        if (root / folder).is_dir():
            return root / folder
    raise FileNotFoundError(f"the product at {root} has no Lua folder ({', '.join(LUA_FOLDERS)})")


def reference_lua() -> bytes:
    """Redisson's original transfer (``redisson_original_transfer.lua``), its includes
    expanded by the product's script runner. ImportError: a product from before Lua
    includes (8d27b2a)."""
    expand_includes = __getattr__("expand_includes")
    text = (HERE / "redisson_original_transfer.lua").read_bytes()
    if (lua_dir() / "include").is_dir():  # issue 48: one function per file, lua/include/<function>.lua
        text = text.replace(b"-- include: _body.lua", b"-- include: ready_body.lua")
    source: bytes = expand_includes(text)
    return source


def __getattr__(name: str) -> Any:
    paths = WHERE.get(name)
    if paths is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(module(*paths), name)
