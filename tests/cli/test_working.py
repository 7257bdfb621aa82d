"""The spinner a large job's read shows on a terminal: what it says as the work moves on,
gone once it ends; off a terminal nothing at all."""

from __future__ import annotations

import io

from rich.console import Console

from cclctl import ui


def _console(terminal: bool) -> Console:
    return Console(file=io.StringIO(), force_terminal=terminal, width=80, color_system=None)


def test_on_a_terminal_it_says_each_step_and_leaves_nothing_behind() -> None:
    console = _console(terminal=True)
    with ui.working("listing the job's statuses in node0:29500", console=console) as say:
        say("reading 12,501 keys of statuses (127.0 MiB)")  # a retitle draws at once
    drawn = console.file.getvalue()  # type: ignore[attr-defined]
    assert "reading 12,501 keys of statuses (127.0 MiB)" in drawn
    # transient: at the end the cursor goes back up over the line and erases it
    assert drawn.endswith("\r\x1b[1A\x1b[2K")


def test_off_a_terminal_it_draws_nothing_and_its_words_go_nowhere() -> None:
    console = _console(terminal=False)
    with ui.working("listing", console=console) as say:
        say("reading")
    assert console.file.getvalue() == ""  # type: ignore[attr-defined]
