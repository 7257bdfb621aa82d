"""Shared rich helpers for commands: progress and chatter on stderr, results on stdout.

Keeping progress on stderr means ``cclctl bench > table.txt`` captures only the table, and a
bar that is transient leaves no residue in a terminal once the work is done.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)


def close_stdout() -> None:
    """Point stdout at /dev/null once its reader has gone (``| head``), so that nothing
    written later, nor Python's flush at exit, fails again (the Python docs' recipe)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    finally:
        os.close(devnull)


class ResultConsole(Console):
    """A console for results on stdout that goes quiet when the reader closes the pipe,
    instead of rich's default of exiting 1, so the command still ends with its own exit
    code (``cclctl diagnose hang DIR | head -1`` keeps the verdict's 3)."""

    def on_broken_pipe(self) -> None:
        self.quiet = True
        close_stdout()


def write_result(text: str) -> None:
    """Write to stdout; a reader that has gone (``| head``) silences it, not the command."""
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:
        close_stdout()


def stderr_console() -> Console:
    """A console for progress, warnings and notes (never for results)."""
    return Console(stderr=True, highlight=False)


class TaskBar:
    """One progress bar's handle: ``advance`` moves it, ``describe`` retitles it."""

    def __init__(self, progress: Progress, total: int, description: str) -> None:
        self._progress = progress
        self._task = progress.add_task(description, total=total)

    def advance(self, steps: int = 1, description: str | None = None) -> None:
        if description is None:
            self._progress.update(self._task, advance=steps)
        else:
            self._progress.update(self._task, advance=steps, description=description)

    def describe(self, description: str) -> None:
        self._progress.update(self._task, description=description)

    @property
    def completed(self) -> int:
        return int(self._progress.tasks[0].completed)


@contextlib.contextmanager
def progress_bar(
    total: int, description: str, *, console: Console | None = None, enabled: bool = True
) -> Iterator[TaskBar]:
    """A transient progress bar on stderr, always stopped on the way out (even on error).

    With ``enabled`` False, or when the console is not a terminal (a log file, a pipe to a
    launcher), nothing is drawn, but the handle still counts, so callers need no second
    code path.
    """
    console = console or stderr_console()
    enabled = enabled and console.is_terminal
    progress = Progress(
        SpinnerColumn(),
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
        disable=not enabled,
    )
    with progress:
        yield TaskBar(progress, total, description)


@contextlib.contextmanager
def working(description: str, *, console: Console | None = None) -> Iterator[Callable[[str], None]]:
    """A transient spinner on stderr while something slow runs (a large job read from its
    store), retitled by the callable it yields as the work moves on. Off a terminal nothing
    is drawn and the callable does nothing, so callers need no second code path."""
    console = console or stderr_console()
    if not console.is_terminal:
        yield lambda words: None
        return
    with console.status(description, spinner="dots") as status:
        yield lambda words: status.update(words)
