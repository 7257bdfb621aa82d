"""An 8-rank job of ``kill_worker.py`` ranks started from the environment, as srun or mpirun
start one (rank 0 hosts the store), for ``kill_latency.py``.

The benchmark is the ranks' parent, so it holds their pids and kills one itself, with no
launcher in between that could notice the death and tear the others down. Each rank's
stdout and stderr are read on threads: ``running`` holds the ranks that printed
``RUNNING``, ``raised`` each rank's ``RAISED`` record. ``close`` releases the survivors,
kills whatever is left and reaps every rank (the killed one stays a zombie until then, so
its peers can read its signal).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any

WORKER = str(Path(__file__).with_name("kill_worker.py"))
TOKEN = "kill-bench-token-0123456789abcdefghijklm"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class KillJob:
    def __init__(self, tmp: Path, n: int, transport: str, job: str) -> None:
        self.n = n
        self.release = tmp / "release"
        self.running: set[int] = set()
        self.raised: dict[int, dict[str, Any]] = {}
        self.other: list[str] = []  # every other line, for the tail of a failed trial
        self._changed = threading.Condition()
        port = _free_port()
        base = {k: v for k, v in os.environ.items() if not k.startswith("CCLCTL_")}
        self.procs: list[subprocess.Popen[str]] = []
        for rank in range(n):
            env = base | {
                "TMPDIR": str(tmp),  # the default dump folder lands here and goes with it
                "RANK": str(rank),
                "WORLD_SIZE": str(n),
                "LOCAL_RANK": str(rank),
                "LOCAL_WORLD_SIZE": str(n),
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
                "CCLCTL_JOB": job,
                "CCLCTL_TOKEN": TOKEN,
                "CCLCTL_TRANSPORT": transport,
                "CCLCTL_TIMEOUT": "30",  # the watchdog stays out of a death's way
                "CCLCTL_STORE_LINGER": "1",
            }
            proc = subprocess.Popen(
                [sys.executable, WORKER, str(self.release)],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                start_new_session=True,
            )
            self.procs.append(proc)
            for stream in (proc.stdout, proc.stderr):
                assert stream is not None
                threading.Thread(target=self._read, args=(rank, stream), daemon=True).start()

    def _read(self, rank: int, stream: IO[str]) -> None:
        for line in stream:
            with self._changed:
                if line.startswith("RUNNING"):
                    self.running.add(rank)
                elif line.startswith("RAISED "):
                    self.raised[rank] = json.loads(line.removeprefix("RAISED "))
                else:
                    self.other.append(f"[{rank}] {line.rstrip()}")
                self._changed.notify_all()

    def wait_for(self, what: str, ranks: set[int], timeout_s: float) -> bool:
        """Until every rank of ``ranks`` is in ``running`` or ``raised`` (``what``)."""
        with self._changed:
            return self._changed.wait_for(lambda: ranks <= set(getattr(self, what)), timeout_s)

    def kill(self, rank: int) -> int:
        """SIGKILL ``rank``; the wall clock read right before the signal."""
        pid = self.procs[rank].pid
        kill_ns = time.time_ns()
        os.kill(pid, signal.SIGKILL)
        return kill_ns

    def tail(self) -> str:
        with self._changed:
            return "\n".join(self.other[-30:])

    def close(self) -> None:
        self.release.touch()
        deadline = time.monotonic() + 10
        for proc in self.procs:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)

    def __enter__(self) -> KillJob:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
