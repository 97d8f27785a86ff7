"""Each script's contract, read from its header (see ``README.md``): its ARGV by name, and
the named slots of its reply. (Its KEYS are ``_keys.key_slots``'s, from the same header.)

A wrapper in ``_calls.py`` passes a script's arguments by name, through :meth:`Contract.argv`;
they go on the wire positionally, in the order the header gives, fixed when the header is
read (once per process). So the header is the one place that says what ARGV[n] is: a
name the header does not declare, or a required one left out, is a :class:`TypeError` in
the wrapper before anything is sent, and a header that is not well formed fails at import.

The grammar of an ARGV line: ``-- ARGV[<n>]  <name>[?] [+<group>]  <text>``, numbered 1,
2, ... in order. ``?`` marks an optional argument (every argument after an optional one is
optional: the call sends the arguments up to the last one given). ``+<group>``, as for
KEYS, marks arguments that come together with a group of optional keys: a call gives all
of a group's or none, and a group left out moves the later arguments up (its positions
are those of a call that gives every group). ``-- ARGV[<n>..]  <name>  <text>`` is a
tail, last and never required: a sequence of values, sent one by one (its layout, which
may depend on an earlier argument, is the text's to say). ``-- ARGV none``: the script
takes no argument.
A reply whose slots are fixed names them on a line ``-- returns: {<name>, <name>, ...}``.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

#: An ARGV line: its number, whether it is a tail, its name, whether it is optional.
_ARGV_LINE = re.compile(r"-- ARGV\[(\d+)(\.\.)?\]\s+([a-z][a-z0-9_]*)(\?)?(?:\s+\+([a-z]+))?(?:\s|$)")

#: The reply's named slots (the line may go on over comment lines indented after "--").
_RETURNS = re.compile(r"^-- returns: \{([^}]*)\}", re.MULTILINE)


@dataclass(frozen=True)
class Contract:
    """A script's ARGV by name and its reply's slots (see the module)."""

    script: str
    #: The arguments' names, in ARGV order.
    names: tuple[str, ...]
    #: A call gives at least the arguments before this index (the last required one's,
    #: plus one): the required ones, and the groups' among them if given.
    required: int
    #: The last name is a tail (a sequence of values).
    tail: bool = False
    #: The reply's slot names, in order; () when the header names none.
    returns: tuple[str, ...] = ()
    #: Argument name -> its group ("+lanes" and the like, without the "+"), for those in one.
    groups: dict[str, str] = field(default_factory=dict)
    _index: dict[str, int] = field(default_factory=dict, repr=False, compare=False)
    #: The names a call gives (as it gives them) -> the names to send, in ARGV order:
    #: checked at a call site's first call, then a lookup (a wrapper gives the same names
    #: in the same order every time; about 1 µs a call instead of 3-7).
    _plans: dict[tuple[str, ...], tuple[str, ...]] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._index.update((name, index) for index, name in enumerate(self.names))

    def argv(self, **given: Any) -> list[Any]:
        """The ARGV of a call that gives ``given`` by name, in the header's order: the
        required ones, then the optional ones up to the last given (an optional one left
        out before it is an error: the script would read the next one in its place).

        Raises:
          TypeError: a name the header does not declare, a required one missing, or an
            optional one missing before one given.
        """
        plan = self._plans.get(tuple(given))
        if plan is None:
            plan = self._plans[tuple(given)] = self._plan(given)
        if self.tail and plan and plan[-1] == self.names[-1]:
            return [*(given[name] for name in plan[:-1]), *given[plan[-1]]]
        return [given[name] for name in plan]

    def _plan(self, given: Mapping[str, Any]) -> tuple[str, ...]:
        """The names to send for a call that gives ``given``, in ARGV order (see :meth:`argv`)."""
        index = self._index
        try:
            end = max(self.required, *(index[name] + 1 for name in given)) if given else self.required
        except KeyError:
            unknown = ", ".join(sorted(set(given) - set(index)))
            raise TypeError(f"{self.script}.lua takes no argument {unknown} (its ARGV: {self.names})") from None
        values: list[str] = []
        groups = self.groups
        given_groups = {groups[name] for name in given if name in groups} if groups else ()
        for group in given_groups:  # a group given whole, up to its last argument
            end = max(end, *(index[name] + 1 for name in groups if groups[name] == group))
        for name in self.names[:end]:
            if groups and name in groups:
                if groups[name] not in given_groups:
                    continue  # a group left out: the later arguments move up
                if name not in given:
                    raise TypeError(f"{self.script}.lua: ARGV {name!r} of group +{groups[name]} is missing")
                values.append(name)
                continue
            if name not in given:
                what = "required" if index[name] < self.required else "left out before a later one given"
                raise TypeError(f"{self.script}.lua: ARGV {name!r} is missing ({what}; its ARGV: {self.names})")
            values.append(name)
        return tuple(values)

    def reply(self, values: Sequence[Any]) -> dict[str, Any]:
        """A reply's slots by name (the header's ``returns`` line)."""
        if len(values) != len(self.returns):
            raise ValueError(f"{self.script}.lua replied {len(values)} values, its header names {len(self.returns)}")
        return dict(zip(self.returns, values, strict=True))


def parse_contract(text: str, script: str = "script") -> Contract:
    """The contract a script's text declares in its header (its leading comment lines).

    Raises:
      ValueError: an ``-- ARGV`` line does not follow the grammar (see the module), the
        arguments are not numbered 1, 2, ... in order, a name repeats, a required one
        follows an optional one, a tail is not last, or the header declares no ARGV and
        does not say ``-- ARGV none``.
    """
    names: list[str] = []
    groups: dict[str, str] = {}
    required, tail, none, optional_seen = 0, False, False, False
    for line in text.splitlines():
        if not line.startswith("--"):
            break
        if not line.startswith("-- ARGV"):
            continue
        if re.match(r"-- ARGV none\b", line):
            none = True
            continue
        match = _ARGV_LINE.match(line)
        if match is None:
            raise ValueError(f"{script}.lua: an ARGV line that is not '-- ARGV[<n>]  <name>[?]  <text>': {line!r}")
        number, is_tail, name, optional, group = int(match[1]), bool(match[2]), match[3], bool(match[4]), match[5]
        if number != len(names) + 1 or tail:
            raise ValueError(f"{script}.lua: ARGV[{number}] is not argument {len(names) + 1}, or follows the tail")
        if name in names:
            raise ValueError(f"{script}.lua: ARGV name {name!r} is used twice")
        if group:
            if optional or is_tail:
                raise ValueError(f"{script}.lua: ARGV {name!r} of a group is neither optional nor a tail")
            groups[name] = group
        elif optional:
            optional_seen = True
        elif not is_tail:  # (a tail may be left out: no values)
            if optional_seen:
                raise ValueError(f"{script}.lua: ARGV {name!r} is required but follows an optional one")
            required = len(names) + 1
        names.append(name)
        tail = is_tail
    if bool(names) == none:
        raise ValueError(f"{script}.lua: its header must list its ARGV, or say '-- ARGV none'")
    found = _RETURNS.search(text.replace("\n--           ", " "))
    returns = tuple(slot.strip() for slot in found[1].split(",")) if found else ()
    return Contract(script, tuple(names), required, tail, returns, groups)


@functools.cache
def contract(script: str) -> Contract:
    """The contract of ``lua/<script>.lua``, read from its header once."""
    text = resources.files(__package__).joinpath("lua").joinpath(f"{script}.lua").read_text(encoding="utf-8")
    return parse_contract(text, script)
