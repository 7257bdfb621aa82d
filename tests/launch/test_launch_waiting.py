"""`cclctl launch` says whom it waits on once the other ranks finished, at the status interval.

Real processes: 4 ranks of tests/support/fault_worker.py running broadcasts over shared
memory, rank 2 stopping itself (SIGSTOP) before seq 5; the slots let ranks 0, 1 and 3 finish
all 8 calls and exit 0. The launcher must name rank 2, stopped, and how far behind it is, in
one line while that lasts; the test reads that line, then kills rank 2. The pure cases pin
the words for a rank in a call, one without a status, and one closing.
"""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from diagnose_factory import Job

from cclctl.commands.launch_waiting import WaitWatch, waiting_line
from cclctl.diagnose.liveness import PROC_RUNNING, PROC_STOPPED
from cclctl.launch.launcher import Waiting
from scripts import script

PY = sys.executable
WAITING = re.compile(
    r"cclctl launch: ranks 0-1,3 finished; waiting on rank 2 \(pid (\d+)\): "
    r"stopped \(process state T\), last seen "
    r"(after seq [1-4] of comm 0:0-3|before comm 0:0-3's first call) "
    r"\(the finished ranks completed seq 8\)"
)


def _lines(stream: object, into: queue.Queue[str | None]) -> None:
    for line in stream:  # type: ignore[attr-defined]
        into.put(line.rstrip("\n"))
    into.put(None)


#: How each case ends the wait, and the launcher's last line then.
ENDINGS = {
    "rank_killed": r"cclctl launch: rank 2 \(pid \d+\) died of SIGKILL.*",
    "interrupted": r"cclctl launch: interrupted waiting on rank 2 \(pid \d+\): stopped "
    r"\(process state T\), last seen .*; all ranks stopped",
}


@pytest.mark.slow
@pytest.mark.timeout(150)
@pytest.mark.parametrize("ending", ENDINGS)
def test_the_launcher_names_a_stopped_rank_its_finished_peers_wait_on(
    tmp_path: Path, ending: str
) -> None:
    """Then rank 2 is killed (the launcher names its death), or the launcher is interrupted
    (Ctrl-C): its last line still names the rank it was waiting on."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CCLCTL_")}
    env |= {
        "CCLCTL_FAULT": "stop:rank=2:seq=5",
        "CCLCTL_STATUS_INTERVAL": "0.2",
        "CCLCTL_TRACE_DIR": str(tmp_path),
        "FAULT_OP": "broadcast",
        "ITERS": "8",
        "PAUSE": "0.3",  # rank 2 publishes statuses before it stops
    }
    cmd = [PY, "-m", "cclctl", "launch", "-n", "4", "--grace", "5", "--", PY]
    launcher = subprocess.Popen(
        [*cmd, script("fault_worker.py")],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    lines: queue.Queue[str | None] = queue.Queue()
    reader = threading.Thread(target=_lines, args=(launcher.stderr, lines), daemon=True)
    reader.start()
    seen: list[str] = []
    try:
        deadline = time.monotonic() + 90
        match = None
        while match is None and time.monotonic() < deadline:
            try:
                line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                break
            if line is None:
                break
            seen.append(line)
            match = WAITING.fullmatch(line)
        assert match is not None, "\n".join(seen[-20:])
        if ending == "rank_killed":
            os.kill(int(match[1]), signal.SIGKILL)
            assert launcher.wait(timeout=60) == 1
        else:
            launcher.send_signal(signal.SIGINT)
            assert launcher.wait(timeout=60) == 128 + signal.SIGINT
        reader.join(timeout=30)
        while (line := lines.get(timeout=5)) is not None:
            seen.append(line)
    finally:
        if launcher.poll() is None:  # the ranks die with it (their parent-death signal)
            os.killpg(launcher.pid, signal.SIGKILL)
            launcher.wait(timeout=30)
    # said once while it lasted, not once an interval
    assert sum(1 for line in seen if WAITING.fullmatch(line)) == 1, seen
    assert re.fullmatch(ENDINGS[ending], seen[-1]), seen


def _waiting(running: dict[int, int], finished: tuple[int, ...]) -> Waiting:
    return Waiting(running=running, finished=finished, for_s=2.0)


def test_a_rank_in_a_call_is_named_with_its_call_and_its_wait() -> None:
    job = Job(4, done=5).complete([0, 1, 3], 8).finish([0, 1, 3])
    job.enter([2], 6, op="broadcast", waiting_on={2: 0})
    statuses = {r: job.snapshot(r, "status") for r in range(4)}
    line = waiting_line(_waiting({2: 77}, (0, 1, 3)), statuses, {2: PROC_RUNNING})
    assert line == (
        "cclctl launch: ranks 0-1,3 finished; waiting on rank 2 (pid 77): running, last seen in "
        "broadcast seq 6 of comm 0:0-3 (waiting to recv from rank 0) "
        "(the finished ranks completed seq 8)"
    )


def test_ranks_without_a_status_or_closing_say_so() -> None:
    job = Job(4, done=8).finish([0, 3])
    statuses = {r: job.snapshot(r, "status") for r in (0, 1, 3)}
    line = waiting_line(_waiting({1: 71, 2: 72}, (0, 3)), statuses, {2: PROC_STOPPED})
    assert line == (
        "cclctl launch: ranks 0,3 finished; waiting on rank 1 (pid 71): running, last seen "
        "after seq 8 of comm 0:0-3; rank 2 (pid 72): stopped (process state T), "
        "no status published yet"
    )
    job.finish([1])
    statuses[1] = job.snapshot(1, "status")
    line = waiting_line(_waiting({1: 71}, (0, 3)), statuses, {})
    assert line.endswith("waiting on rank 1 (pid 71): running, its communicator closed")


def test_the_watch_says_a_line_once_until_it_changes() -> None:
    said: list[str] = []
    watch = WaitWatch(said.append)
    me = os.getpid()  # a running process: its state reads "running"
    for _ in range(3):
        watch(_waiting({2: me}, (0, 1, 3)), None)
    watch(_waiting({1: me, 2: me}, (0, 3)), None)
    assert said == [
        f"cclctl launch: ranks 0-1,3 finished; waiting on rank 2 (pid {me}): running, "
        "no status published yet",
        f"cclctl launch: ranks 0,3 finished; waiting on rank 1 (pid {me}): running, no status "
        f"published yet; rank 2 (pid {me}): running, no status published yet",
    ]
