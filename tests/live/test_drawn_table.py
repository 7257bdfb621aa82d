"""`top`'s table drawn line by line is what rich's ``Table`` draws with top's settings:
character for character without colour (a pipe), and the same text with it."""

from __future__ import annotations

import io
import random
import re

import pytest
from rich import box
from rich.console import Console
from rich.table import Table

from cclctl.commands.drawn_table import Column, DrawnTable

WORDS = ["ok", "waiting", "never", "entered", "all_reduce", "seq", "5000", "stale", "(slow)",
         "x" * 45, "status", "for", "rank", "2", "a" * 12, "0:0-99999", "-", "12.50"]  # fmt: skip
STYLES = ["", "bold red", "dim", "yellow"]
WRAPS = [0, 0, 10, 40]  # 0: never wraps
ANSI = re.compile(r"\x1b\[[0-9;]*m")

Rows = list[tuple[list[str], str]]


def _console(colour: bool) -> Console:
    return Console(
        file=io.StringIO(),
        width=400,
        highlight=False,
        color_system="standard" if colour else None,
        force_terminal=colour,
    )


def by_rich(columns: list[Column], rows: Rows, colour: bool) -> str:
    """What `top` drew before: rich's Table with its settings (top_screen.render's)."""
    table = Table(box=box.SIMPLE_HEAD, padding=(0, 1, 0, 0), pad_edge=False, show_edge=False)
    for c in columns:
        table.add_column(c.title, justify="right" if c.right else "left", no_wrap=not c.wrap,
                         max_width=c.wrap or None, overflow="fold")  # fmt: skip
    for cells, style in rows:
        table.add_row(*cells, style=style)
    console = _console(colour)
    console.print(table)
    return console.file.getvalue()  # type: ignore[attr-defined]


def drawn(columns: list[Column], rows: Rows, colour: bool) -> str:
    console = _console(colour)
    console.print(DrawnTable(columns, rows))
    return console.file.getvalue()  # type: ignore[attr-defined]


def tables(seed: int, count: int) -> list[tuple[list[Column], Rows]]:
    """Tables of 1-6 columns, some right-justified, some wrapping at 10 or 40 characters
    (cells of many words, words longer than the column), 0-6 rows of mixed styles."""
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        columns = [
            Column(f"c{i}" * rng.randint(1, 3), right=rng.random() < 0.4, wrap=rng.choice(WRAPS))
            for i in range(rng.randint(1, 6))
        ]
        rows: Rows = []
        for _ in range(rng.randint(0, 6)):
            cells = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(0, 8))) if c.wrap
                     else rng.choice([*WORDS[:9], "", "-", "12.50"]) for c in columns]  # fmt: skip
            rows.append((cells, rng.choice(STYLES)))
        out.append((columns, rows))
    return out


@pytest.mark.parametrize("seed", range(4))
def test_without_colour_it_is_riches_table_character_for_character(seed: int) -> None:
    for columns, rows in tables(seed, 100):
        assert drawn(columns, rows, colour=False) == by_rich(columns, rows, colour=False)


@pytest.mark.parametrize("seed", range(2))
def test_with_colour_it_shows_the_same_text_styled(seed: int) -> None:
    for columns, rows in tables(100 + seed, 100):
        mine = drawn(columns, rows, colour=True)
        assert ANSI.sub("", mine) == ANSI.sub("", by_rich(columns, rows, colour=True))
        if any(style for _, style in rows):
            assert "\x1b[" in mine


def test_a_wrapped_cell_goes_on_under_itself_and_a_long_word_is_cut() -> None:
    columns = [Column("rank", right=True), Column("state", wrap=10), Column("op")]
    rows = [(["7", "stale for rank 2 " + "y" * 14, "all_reduce"], "")]
    lines = ["rank  state       op", "   7  stale for   all_reduce", "      rank 2",
             "      yyyyyyyyyy", "      yyyy"]  # fmt: skip
    expected = [line.ljust(28) for line in lines]
    assert drawn(columns, rows, colour=False).splitlines() == [expected[0], "─" * 28, *expected[1:]]
