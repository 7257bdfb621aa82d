"""Watching the processes a test started, by their pids, with deadlines."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path


def gone(pid: int) -> bool:
    """The process has exited (a zombie not yet reaped counts as exited)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rpartition(")")[2].split()[0] == "Z"


def until(what: str, check: Callable[[], bool], timeout_s: float) -> None:
    """Poll ``check`` until it holds; fail the test after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"still not {what} after {timeout_s:g}s")
        time.sleep(0.05)
