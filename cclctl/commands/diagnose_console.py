"""The console a `cclctl diagnose` report prints on: lines stay whole, and a pipe or a log
gets a width that squeezes no column away."""

from __future__ import annotations

from cclctl import ui

#: the width of a report written to a pipe or a log (a terminal's own width otherwise)
PIPE_WIDTH = 160


def report_console() -> ui.ResultConsole:
    """A result console for a diagnosis report, :data:`PIPE_WIDTH` wide when not a terminal."""
    console = ui.ResultConsole(highlight=False, soft_wrap=True)  # commands stay whole
    if not console.is_terminal and console.width <= 80:
        console.width = PIPE_WIDTH  # a pipe or a log: no column squeezed away
    return console
