"""`top`'s rank table drawn line by line, in time linear in its cells.

It draws what rich's ``Table`` draws for top (the ``SIMPLE_HEAD`` box without its edge, one
space of right padding per cell, the ``state`` column wrapped at a width), character for
character, but as pre-formatted lines: rich measures and renders every cell as an object of
its own, 1.7 ms a row on the machines cclctl was measured on, so a pipe's table of 10,000
ranks took 17 s to draw and one of 100,000 over three minutes. Each column is as wide as its
widest cell or title (a wrapped column at most its limit); numbers are right-justified; a
cell wider than a wrapped column goes on under itself, word by word, a word longer than the
column cut where the column ends; a row's style covers its whole line.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence

from rich.console import Console, ConsoleOptions, RenderResult
from rich.segment import Segment
from rich.style import Style

#: Between two columns: a cell's right padding and the box's blank rule (rich draws both).
GAP = "  "
#: What ``SIMPLE_HEAD`` draws under the titles.
RULE = "─"
#: The titles' style (rich's ``table.header``).
HEADER = "bold"


@dataclasses.dataclass(frozen=True)
class Column:
    """A column's title, whether its cells are right-justified, and the width it wraps
    at (0: never wraps)."""

    title: str
    right: bool = False
    wrap: int = 0


@dataclasses.dataclass(frozen=True)
class DrawnTable:
    """The table as rich would print it (``rows``: each row's cells and its style)."""

    columns: Sequence[Column]
    rows: Sequence[tuple[Sequence[str], str]]

    def _cells(self) -> Iterator[tuple[str | tuple[str, ...], str]]:
        """Each printed line's cells justified to their widths (the rule under the titles:
        one text), and its style: the titles, the rule, then the rows'."""
        widths = self._widths()
        columns = self.columns
        yield _justified(tuple(c.title for c in columns), columns, widths), HEADER
        yield RULE * (sum(widths) + len(GAP) * (len(widths) - 1)), ""
        wraps = [i for i, c in enumerate(columns) if c.wrap]
        for cells, style in self.rows:
            if not any(len(cells[i]) > widths[i] for i in wraps):
                yield _justified(cells, columns, widths), style
                continue
            parts = [_wrapped(c, widths[i]) if i in wraps else [c] for i, c in enumerate(cells)]
            for k in range(max(map(len, parts))):
                row = tuple(p[k] if k < len(p) else "" for p in parts)
                yield _justified(row, columns, widths), style

    def _widths(self) -> list[int]:
        widths = [len(c.title) for c in self.columns]
        for cells, _ in self.rows:
            widths = [max(w, len(cell)) for w, cell in zip(widths, cells, strict=True)]
        return [
            max(len(c.title), min(w, c.wrap)) if c.wrap else w
            for c, w in zip(self.columns, widths, strict=True)
        ]

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        """Without colour (a pipe): a segment per line. With it (a terminal, where top
        shows the rows that fit): rich's own segments, each cell and its padding in the
        row's style, the rule between columns in none."""
        plain = console.no_color or console.color_system is None
        styles: dict[str, Style] = {}
        for cells, name in self._cells():
            style = styles.get(name)
            if style is None:
                style = styles[name] = Style.parse(name) if name else Style.null()
            if plain or isinstance(cells, str):
                yield Segment(cells if isinstance(cells, str) else GAP.join(cells), style)
            else:
                for i, cell in enumerate(cells):
                    if i:
                        yield Segment(" ")
                    yield Segment(cell, style)
                    if i + 1 < len(cells):
                        yield Segment(" ", style)
            yield Segment.line()


def _justified(
    cells: Sequence[str], columns: Sequence[Column], widths: Sequence[int]
) -> tuple[str, ...]:
    return tuple(
        cell.rjust(width) if column.right else cell.ljust(width)
        for cell, column, width in zip(cells, columns, widths, strict=True)
    )


def _wrapped(text: str, width: int) -> list[str]:
    """``text`` in lines of at most ``width``: words kept whole where they fit, a word
    longer than a line cut at its end (rich's ``overflow="fold"``)."""
    lines: list[str] = []
    line = ""
    for word in text.split():
        while len(word) > width:
            if line:
                lines.append(line)
                line = ""
            lines.append(word[:width])
            word = word[width:]
        if not word:
            continue
        if not line:
            line = word
        elif len(line) + 1 + len(word) <= width:
            line = f"{line} {word}"
        else:
            lines.append(line)
            line = word
    if line or not lines:
        lines.append(line)
    return lines
