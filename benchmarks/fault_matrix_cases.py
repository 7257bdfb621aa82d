"""The fault matrix's cases and how each runs: under `cclctl launch` or from the environment.

See benchmarks/fault_matrix.py. ``judge(args)`` runs ``cclctl diagnose hang`` with those
arguments and says whether it named the culprit ("right", "wrong", "none": no answer).
"""

from __future__ import annotations

import dataclasses
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

Judge = Callable[[list[str]], str]

PY = sys.executable
ROOT = Path(__file__).resolve().parents[1]
WORKER = str(ROOT / "tests" / "support" / "fault_worker.py")
SEQ = 5
TIMEOUT_S = 2.0  # CCLCTL_TIMEOUT: hangs (stop, sleep, skip) expire after it
CASE_DEADLINE_S = 40.0
FAULTS = {
    "kill": "kill:rank={c}:seq=5",
    "stop": "stop:rank={c}:seq=5",
    "sleep": "sleep:rank={c}:seq=5:secs=6",
    "skip": "skip:rank={c}:seq=5",
    "op": "op:rank={c}:seq=5:to={other}",
    "count": "count:rank={c}:seq=5:to=7",
    "link": "link:rank={c}:seq=5:peer={peer}",
}
OPS = ("all_reduce", "all_gather", "broadcast")
FAILED_LINE = re.compile(r"rank (\d+) failed: (.*)")


@dataclasses.dataclass(frozen=True)
class Case:
    fault: str
    ranks: int
    op: str
    mode: str  # "launch" or "env"
    transport: str  # "shm" or "tcp"

    @property
    def culprits(self) -> tuple[int, ...]:
        c = self.ranks - 2
        return (c, c + 1) if self.fault == "link" else (c,)

    def plan(self) -> str:
        c = self.ranks - 2
        other = "all_reduce" if self.op != "all_reduce" else "broadcast"
        return FAULTS[self.fault].format(c=c, peer=c + 1, other=other)

    def label(self) -> str:
        return f"{self.fault} n={self.ranks} {self.op} {self.mode} {self.transport}"


def base_env(case: Case, dumps: str, job: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CCLCTL_")}
    env.update(
        CCLCTL_FAULT=case.plan(),
        CCLCTL_TIMEOUT=str(TIMEOUT_S),
        CCLCTL_TRACE_DIR=dumps,
        CCLCTL_STATUS_INTERVAL="0.2",
        CCLCTL_JOB=job,
        CCLCTL_TRANSPORT="tcp" if case.transport == "tcp" else "auto",
        FAULT_OP=case.op,
        ITERS="8",
        PAUSE="0.1",
        HOLD_ON_ERROR="0",
        PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
    )
    return env


class Reader:
    """Collect a process's stderr lines; ``failed`` is set at the first rank's error line."""

    def __init__(self, stream, rank: int | None = None) -> None:  # type: ignore[no-untyped-def]
        self.lines: list[str] = []
        self.rank = rank
        self.failed = threading.Event()
        self.thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self.thread.start()

    def _read(self, stream) -> None:  # type: ignore[no-untyped-def]
        for raw in stream:
            line = raw.decode(errors="replace").rstrip("\n")
            self.lines.append(line)
            if FAILED_LINE.search(line):
                self.failed.set()

    def errors(self) -> dict[int, str]:
        out: dict[int, str] = {}
        for line in self.lines:
            m = FAILED_LINE.search(line)
            if m:
                out.setdefault(int(m.group(1)), m.group(2))
        return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def stop_all(procs: list[subprocess.Popen[bytes]]) -> None:
    """SIGCONT and SIGTERM what still runs (it dumps), then SIGKILL after a grace."""
    for p in procs:
        if p.poll() is None:
            for sig in (signal.SIGTERM, signal.SIGCONT):
                os.killpg(p.pid, sig)
    deadline = time.monotonic() + 5
    for p in procs:
        try:
            p.wait(max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


@dataclasses.dataclass
class Ran:
    """What one case's processes did: errors by rank, the live verdict, the launcher's last
    line, and whether the job completed (every process exited 0: the fault delayed it, as a
    sleep before a broadcast whose peers do not wait on the sleeper, but failed nothing)."""

    errors: dict[int, str]
    live: str
    last: str = ""
    completed: bool = False


def run_launch(case: Case, dumps: str, job: str, judge: Judge) -> Ran:
    """A ``cclctl launch`` case."""
    cmd = [PY, "-m", "cclctl", "launch", "-n", str(case.ranks), "--grace", "2", "--", PY, WORKER]
    env = base_env(case, dumps, job)
    proc = subprocess.Popen(
        cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True
    )
    reader = Reader(proc.stderr)
    live = "none"
    try:
        deadline = time.monotonic() + CASE_DEADLINE_S
        while time.monotonic() < deadline and proc.poll() is None:
            if reader.failed.wait(0.05):
                address = _launch_store(reader.lines)
                if address:
                    live = judge(["--store", address, "--job", job])
                break
        proc.wait(max(deadline - time.monotonic(), 0.1))
    except subprocess.TimeoutExpired:
        pass
    finally:
        stop_all([proc])
        reader.thread.join(5)
    last = reader.lines[-1] if reader.lines else ""
    return Ran(reader.errors(), live, last, completed=proc.returncode == 0)


def _launch_store(lines: list[str]) -> str:
    for line in lines:
        m = re.match(r"cclctl: job \S+ store (\S+);", line)
        if m:
            return m.group(1)
    return ""


def run_env(case: Case, dumps: str, job: str, judge: Judge) -> Ran:
    """An env-launched case, rank 0 hosting the store (no launcher line)."""
    port = free_port()
    procs, readers = [], []
    for rank in range(case.ranks):
        env = base_env(case, dumps, job)
        env.update(RANK=str(rank), WORLD_SIZE=str(case.ranks), LOCAL_RANK=str(rank))
        env.update(LOCAL_WORLD_SIZE=str(case.ranks), MASTER_ADDR="127.0.0.1")
        env.update(MASTER_PORT=str(port))
        proc = subprocess.Popen(
            [PY, WORKER],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        procs.append(proc)
        readers.append(Reader(proc.stderr, rank))
    live = "none"
    try:
        deadline = time.monotonic() + CASE_DEADLINE_S
        while time.monotonic() < deadline and not any(r.failed.is_set() for r in readers):
            if all(p.poll() is not None for p in procs):
                break  # every rank ended with no error line: nothing failed to judge live
            time.sleep(0.02)
        if any(r.failed.is_set() for r in readers):
            live = judge(["--store", f"127.0.0.1:{port}", "--job", job])
        _wait_for_survivors(procs, case, deadline)
    finally:
        stop_all(procs)
    errors: dict[int, str] = {}
    for r in readers:
        r.thread.join(5)
        errors.update(r.errors())
    return Ran(errors, live, completed=all(p.returncode == 0 for p in procs))


def _wait_for_survivors(procs: list[subprocess.Popen[bytes]], case: Case, deadline: float) -> None:
    """Until every rank but the culprits ended (their errors are in), or the deadline."""
    others = [p for r, p in enumerate(procs) if r not in case.culprits]
    while time.monotonic() < deadline and any(p.poll() is None for p in others):
        time.sleep(0.05)
