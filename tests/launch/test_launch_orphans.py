"""``kill -9`` of ``cclctl launch`` leaves no rank behind, even ranks that ignore SIGTERM and
print nothing (nothing would ever tell them the job is over).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from launch_helpers import assert_all_gone

from cclctl.launch import child_guard

RANKS = 3
# A quiet rank: ignores SIGTERM, writes its pid where the test finds it, sleeps.
QUIET = (
    "import os, signal, sys, time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "path = os.path.join(sys.argv[1], os.environ['RANK'] + '.pid')\n"
    "open(path + '.tmp', 'w').write(str(os.getpid()))\n"
    "os.rename(path + '.tmp', path)\n"
    "time.sleep(120)\n"
)


def rank_pids(folder: Path, within_s: float = 30.0) -> list[int]:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        files = sorted(folder.glob("*.pid"))
        if len(files) == RANKS:
            return [int(f.read_text()) for f in files]
        time.sleep(0.05)
    raise AssertionError(f"the ranks did not start within {within_s:g}s")


linux_only = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's"
)


@pytest.mark.timeout(90)
@linux_only
def test_kill_9_of_the_launcher_takes_quiet_ranks_with_it(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "cclctl", "launch", "-n", str(RANKS), "--"]
    cmd += [sys.executable, "-c", QUIET, str(tmp_path)]
    launcher = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    pids: list[int] = []
    try:
        pids = rank_pids(tmp_path)
        parents = {psutil.Process(pid).ppid() for pid in pids}
        assert parents == {launcher.pid}  # the guard became the rank: no process between
        launcher.kill()
        launcher.wait()
        assert_all_gone(pids, within_s=10.0)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
        for pid in pids:  # only if the guard failed: never leave them to the next test
            if psutil.pid_exists(pid):
                os.kill(pid, signal.SIGKILL)


@linux_only
def test_a_guard_whose_launcher_is_already_gone_kills_itself() -> None:
    """The launcher died before the guard was set: nobody would signal it, so it ends."""
    guard = child_guard.guarded(["sleep", "60"], launcher_pid=1)  # not its parent
    done = subprocess.run(guard, timeout=30)
    assert done.returncode == -signal.SIGKILL


@linux_only
def test_a_command_the_guard_cannot_run_exits_127_saying_why(tmp_path: Path) -> None:
    program = tmp_path / "not-executable"
    program.write_text("#!/bin/sh\n")
    guard = child_guard.guarded([str(program)], launcher_pid=os.getpid())
    done = subprocess.run(guard, capture_output=True, text=True, timeout=30)
    assert done.returncode == child_guard.EXIT_CANNOT_RUN
    assert done.stderr == f"cclctl: cannot run {str(program)!r}: Permission denied\n"
