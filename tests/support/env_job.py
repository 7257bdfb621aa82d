"""A job started the way srun or mpirun start one: N bare rank processes that find each other
from RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT, rank 0 hosting the job's store.

Each rank runs ``fault_worker.py`` and exits after its first error (``HOLD_ON_ERROR=0``,
unless ``extra`` says otherwise), so a test reads every survivor's one error line.
``finish`` kills whatever is left (a stopped rank) and reaps everything; ``errors`` still
reads what each rank wrote.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

WORKER = str(Path(__file__).with_name("fault_worker.py"))
TOKEN = "env-job-token-0123456789abcdefghijklmno"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class EnvJob:
    def __init__(
        self,
        tmp: Path,
        n: int,
        *,
        fault: str = "",
        transport: str = "auto",
        op: str = "all_reduce",
        timeout_s: float = 2.0,
        iters: int = 8,
        job: str = "envjob",
        extra: dict[str, str] | None = None,
    ) -> None:
        self.n = n
        self.job = job
        self.port = free_port()
        base = {k: v for k, v in os.environ.items() if not k.startswith("CCLCTL_")}
        self.procs: list[subprocess.Popen[bytes]] = []
        for rank in range(n):
            env = {
                **base,
                "TMPDIR": str(tmp),
                "RANK": str(rank),
                "WORLD_SIZE": str(n),
                "LOCAL_RANK": str(rank),
                "LOCAL_WORLD_SIZE": str(n),
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(self.port),
                "CCLCTL_JOB": job,
                "CCLCTL_TOKEN": TOKEN,
                "CCLCTL_TRANSPORT": transport,
                "CCLCTL_TIMEOUT": str(timeout_s),
                "CCLCTL_STATUS_INTERVAL": "0.2",
                "CCLCTL_FAULT": fault,
                "FAULT_OP": op,
                "ITERS": str(iters),
                "PAUSE": "0.2",
                "HOLD_ON_ERROR": "0",
                **(extra or {}),
            }
            self.procs.append(
                subprocess.Popen(
                    [sys.executable, WORKER],
                    env=env,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.PIPE,
                    start_new_session=True,
                )
            )

    @property
    def store(self) -> str:
        return f"127.0.0.1:{self.port}"

    def errors(self, ranks: list[int], timeout_s: float = 60.0) -> dict[int, str]:
        """Each of ``ranks``' error line, once it has exited (its stderr's last line)."""
        out: dict[int, str] = {}
        deadline = time.monotonic() + timeout_s
        for rank in ranks:
            proc = self.procs[rank]
            try:
                _, err = proc.communicate(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                out[rank] = "<still running>"
                continue
            lines = [ln for ln in err.decode(errors="replace").splitlines() if ln.strip()]
            failed = [ln for ln in lines if ln.startswith(f"rank {rank} failed: ")]
            out[rank] = failed[-1] if failed else (lines[-1] if lines else "")
        return out

    def finish(self) -> None:
        """Kill whatever still runs and reap it (its error lines stay readable)."""
        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
        for proc in self.procs:
            proc.wait(10)
