"""Real slow jobs for the slow-job tests: the worker's ranks, the verdict polled from their
store until it says what the test waits for, busy loops, and a cgroup v1 CPU quota."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

from processes import until

from cclctl.commands.store_access import connect
from cclctl.diagnose.slow_model import SlowReport
from cclctl.diagnose_io.slow_inputs import slow_live
from cclctl.live.snapshot import fetch

WORKER = str(Path(__file__).with_name("slow_worker.py"))
CPU_CGROUP = Path("/sys/fs/cgroup/cpu")
#: The window the tests' ranks cut their signals into (CCLCTL_SLOW_WINDOW).
WINDOW_S = "1"


def worker_env(tmp: Path, **extra: str) -> dict[str, str]:
    return {
        "CCLCTL_SLOW_WINDOW": WINDOW_S,
        "RELEASE": str(tmp / "release"),
        "CCLCTL_TRACE_DIR": str(tmp / "dumps"),
        **extra,
    }


def poll(
    store: str, job: str, done: Callable[[SlowReport], bool], timeout_s: float = 90
) -> list[SlowReport]:
    """Every verdict read from the live job until ``done`` holds for one (the last)."""
    seen: list[SlowReport] = []
    client = connect(store)
    try:

        def check() -> bool:
            seen.append(slow_live(fetch(client, job)))
            return done(seen[-1])

        until("judged as wanted", check, timeout_s)
    finally:
        client.close()
    return seen


def judged(windows: int) -> Callable[[SlowReport], bool]:
    return lambda report: report.windows_judged >= windows


@contextlib.contextmanager
def busy_loops(count: int) -> Iterator[list[int]]:
    """``count`` processes spinning on the CPU; killed and reaped on the way out."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        yield [p.pid for p in procs]
    finally:
        for proc in procs:
            proc.kill()
            proc.wait(timeout=10)


def can_limit_cpu() -> bool:
    return (CPU_CGROUP / "cpu.cfs_quota_us").exists() and os.access(CPU_CGROUP, os.W_OK)


@contextlib.contextmanager
def cpu_quota(pid: int, share: float) -> Iterator[Path]:
    """Put ``pid`` in a child cgroup of the v1 ``cpu`` controller allowed ``share`` of one
    CPU; moved back and the cgroup removed on the way out."""
    group = CPU_CGROUP / f"cclctl-test-{uuid.uuid4().hex[:8]}"
    group.mkdir()
    try:
        period = int((group / "cpu.cfs_period_us").read_text())
        (group / "cpu.cfs_quota_us").write_text(str(int(period * share)))
        (group / "cgroup.procs").write_text(str(pid))
        yield group
    finally:
        with contextlib.suppress(OSError):  # the rank may be gone already
            for task in (group / "cgroup.procs").read_text().split():
                (CPU_CGROUP / "cgroup.procs").write_text(task)
        group.rmdir()
