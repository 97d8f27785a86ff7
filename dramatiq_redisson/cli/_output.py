"""Printing: JSON documents, and lines and tables for people (with ``rich`` when it is
installed, else plain aligned text)."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Cell:
    text: str
    style: str | None = None


@dataclass
class Table:
    """A table to print with rich or as plain aligned text."""

    headers: list[str]
    #: Column indexes aligned right (numbers).
    numeric: set[int] = field(default_factory=set)
    rows: list[list[Cell]] = field(default_factory=list)

    def add(self, *cells: str | Cell) -> None:
        self.rows.append([cell if isinstance(cell, Cell) else Cell(cell) for cell in cells])


#: What a command prints for people: lines (with an optional style) and tables.
Block = Cell | Table


class Output:
    """Prints JSON documents, lines and tables on stdout; notes and errors on stderr."""

    def __init__(self, *, json_mode: bool, plain: bool) -> None:
        self.json_mode = json_mode
        self.console: Any = None
        if not plain and not json_mode:
            try:
                from rich.console import Console
            except ImportError:
                pass
            else:
                terminal = sys.stdout.isatty()
                # Off a terminal rich would wrap at 80 columns: let tables take their width.
                self.console = Console(highlight=False, width=None if terminal else 4096, soft_wrap=not terminal)

    def json(self, document: Any) -> None:
        sys.stdout.write(json.dumps(document, default=str) + "\n")
        sys.stdout.flush()

    def blocks(self, blocks: Sequence[Block]) -> None:
        if self.console is not None and self.console.is_terminal:
            self.console.print(self.renderable(blocks))
        elif self.console is not None:
            # rich pads every cell to its column's width: drop the trailing spaces.
            with self.console.capture() as captured:
                self.console.print(self.renderable(blocks))
            sys.stdout.write("".join(line.rstrip() + "\n" for line in captured.get().splitlines()))
        else:
            sys.stdout.write("".join(line + "\n" for line in plain_lines(blocks)))
        sys.stdout.flush()

    def line(self, text: str, style: str | None = None) -> None:
        self.blocks([Cell(text, style)])

    @staticmethod
    def note(text: str) -> None:
        """A line for the operator on stderr (not part of the command's output)."""
        sys.stderr.write(text + "\n")
        sys.stderr.flush()

    def renderable(self, blocks: Sequence[Block]) -> Any:
        from rich import box
        from rich.console import Group
        from rich.table import Table as RichTable
        from rich.text import Text

        parts: list[Any] = []
        for block in blocks:
            if isinstance(block, Cell):
                parts.append(Text(block.text, style=block.style or ""))
                continue
            table = RichTable(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, header_style="bold")
            for index, header in enumerate(block.headers):
                table.add_column(header, justify="right" if index in block.numeric else "left", no_wrap=True)
            for row in block.rows:
                table.add_row(*(Text(cell.text, style=cell.style or "") for cell in row))
            parts.append(table)
        return Group(*parts)


def plain_lines(blocks: Sequence[Block]) -> list[str]:
    """Blocks as plain text: tables with columns two spaces apart, a dashed rule under
    the headers, numbers aligned right."""
    lines: list[str] = []
    for block in blocks:
        if isinstance(block, Cell):
            lines.append(block.text)
            continue
        texts = [block.headers] + [[cell.text for cell in row] for row in block.rows]
        widths = [max(len(row[i]) for row in texts) for i in range(len(block.headers))]

        def fmt(row: list[str], block: Table = block, widths: list[int] = widths) -> str:
            cells = [
                text.rjust(width) if i in block.numeric else text.ljust(width)
                for i, (text, width) in enumerate(zip(row, widths, strict=True))
            ]
            return "  ".join(cells).rstrip()

        lines.append(fmt(block.headers))
        lines.append("  ".join("-" * width for width in widths))
        lines.extend(fmt(row) for row in texts[1:])
    return lines
