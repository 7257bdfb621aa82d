"""A ``cclctl launch`` job of abort_worker.py ranks for `cclctl abort`'s tests and benchmark.

The launcher runs in a thread; every rank's lines are kept. ``ready`` holds each rank's
JSON line (it has run a collective), ``aborted`` each rank's ``ABORTED`` line (the time it
raised and its error). ``close`` releases the ranks, continues any stopped one and waits
for the job, so nothing outlives the test.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from cclctl.launch.launcher import LaunchResult, launch
from scripts import script


class AbortJob:
    def __init__(
        self, tmp: Path, n: int = 4, fault: str = "", env: dict[str, str] | None = None
    ) -> None:
        self.n = n
        self.release = tmp / f"release-{time.monotonic_ns()}"
        self.ready: dict[int, dict[str, Any]] = {}
        self.aborted: dict[int, tuple[int, str]] = {}  # rank -> (time_ns raised, error)
        self.lines: list[str] = []
        self.results: list[LaunchResult] = []
        self._changed = threading.Condition()
        ranks_env = {"CCLCTL_STATUS_INTERVAL": "0.2", "CCLCTL_FAULT": fault, **(env or {})}
        cmd = [sys.executable, script("abort_worker.py"), str(self.release)]
        self._thread = threading.Thread(
            target=lambda: self.results.append(
                launch(cmd, n, env=ranks_env, output=self._line, timeout_s=90)
            ),
            daemon=True,
        )
        self._thread.start()

    def _line(self, rank: int, stream: str, line: str) -> None:
        with self._changed:
            self.lines.append(f"[{rank}] {line}")
            if stream == "stdout" and line.startswith("{"):
                self.ready[rank] = json.loads(line)
            elif stream == "stderr" and line.startswith("ABORTED "):
                _, raised, error = line.split(" ", 2)
                self.aborted[rank] = (int(raised), error)
            self._changed.notify_all()

    def wait_for(self, what: str, ranks: set[int], timeout_s: float = 60) -> bool:
        """Until every rank of ``ranks`` is in ``ready`` or ``aborted`` (``what``)."""
        with self._changed:
            return self._changed.wait_for(
                lambda: ranks <= set(getattr(self, what)) or bool(self.results), timeout_s
            ) and ranks <= set(getattr(self, what))

    @property
    def store(self) -> str:
        return str(self.ready[0]["store"])

    @property
    def job(self) -> str:
        return str(self.ready[0]["job"])

    def pid(self, rank: int) -> int:
        return int(self.ready[rank]["pid"])

    def wait_stopped(self, rank: int, timeout_s: float = 60) -> bool:
        """Until rank's process is stopped (state T), as ``CCLCTL_FAULT=stop`` leaves it."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if _state(self.pid(rank)) in ("T", "t"):
                return True
            time.sleep(0.02)
        return False

    def abort(
        self, *args: str, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        """``cclctl abort`` as an operator on this host runs it (the token from its file)."""
        base = {k: v for k, v in os.environ.items() if not k.startswith("CCLCTL_")}
        cmd = [sys.executable, "-m", "cclctl", "abort", "--store", self.store, *args]
        return subprocess.run(
            cmd, capture_output=True, text=True, timeout=60, env=base | (env or {})
        )

    def tail(self) -> str:
        return "\n".join(self.lines[-30:])

    def close(self) -> None:
        self.release.touch()
        for rank in self.ready:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid(rank), signal.SIGCONT)
        self._thread.join(90)

    def __enter__(self) -> AbortJob:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return ""
