"""Local process states behind rank documents, read from real processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest
from diagnose_factory import Job

from cclctl.diagnose_io.procs import for_post_mortem, process_state, process_states


def now_ns() -> int:
    return time.time_ns()


def wait_for(pid: int, status: str) -> None:
    deadline = time.monotonic() + 10
    while psutil.Process(pid).status() != status:
        assert time.monotonic() < deadline, f"pid {pid} never became {status}"
        time.sleep(0.01)


@pytest.mark.timeout(30)
def test_running_stopped_and_continued(sleeper: subprocess.Popen[bytes]):
    written = now_ns()
    assert process_state(sleeper.pid, written) == "running"
    sleeper.send_signal(signal.SIGSTOP)
    wait_for(sleeper.pid, psutil.STATUS_STOPPED)
    assert process_state(sleeper.pid, written) == "stopped"
    sleeper.send_signal(signal.SIGCONT)
    wait_for(sleeper.pid, psutil.STATUS_SLEEPING)
    assert process_state(sleeper.pid, written) == "running"


@pytest.mark.timeout(30)
def test_zombie_then_gone():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        written = now_ns()
        wait_for(proc.pid, psutil.STATUS_ZOMBIE)  # exited, not yet reaped by us
        assert process_state(proc.pid, written) == "zombie"
    finally:
        proc.wait(timeout=10)
    assert process_state(proc.pid, written) == "gone"


def test_a_reused_pid_counts_as_gone():
    """A document written long before this process started came from another process."""
    assert process_state(os.getpid(), now_ns()) == "running"
    assert process_state(os.getpid(), now_ns() - 10**9 * 3600 * 24 * 365 * 30) == "gone"


def test_only_ranks_on_this_host_are_looked_at():
    job = Job(3)
    job.t0 = now_ns()
    job.hosts = {0: "here", 1: "here", 2: "elsewhere"}
    job.pids = {0: os.getpid(), 1: os.getpid(), 2: os.getpid()}
    assert process_states(job.snapshots(), host="here") == {0: "running", 1: "running"}


def test_post_mortem_ignores_states_once_every_process_is_gone():
    assert for_post_mortem({0: "gone", 1: "zombie"}) == {}
    states = {0: "gone", 1: "stopped"}
    assert for_post_mortem(states) == states
