"""Fixtures shared by the diagnosis tests."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator

import pytest


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    """A real process to stand for a rank; always killed and reaped (even if stopped)."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        yield proc
    finally:
        proc.send_signal(signal.SIGCONT)
        proc.kill()
        proc.wait(timeout=10)
