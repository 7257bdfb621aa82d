"""A fault-injection job under the test's control: a store of our own and bare rank processes.

Unlike a launcher, nothing here stops the other ranks when one dies or freezes, so the live
diagnosis sees the job exactly as an SRE would find a hung job. ``finish`` then terminates the
survivors (they dump on SIGTERM) for the post-mortem, and SIGKILLs whatever remains.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from ports import free_port

from cclctl.config import job_dir
from cclctl.store.client import StoreServer

WORKER = str(Path(__file__).with_name("fault_worker.py"))
TOKEN = "fault-job-token-0123456789abcdefghijkl"  # the job's, as a launcher makes one


def error_lines(
    procs: dict[int, subprocess.Popen[bytes]], ranks: list[int], timeout_s: float = 60.0
) -> dict[int, str]:
    """Each of ``ranks``' error line (``rank r failed: ...``, else its stderr's last line)
    once it has exited; ``<still running>`` for one that did not within ``timeout_s``."""
    out: dict[int, str] = {}
    deadline = time.monotonic() + timeout_s
    for rank in ranks:
        try:
            _, err = procs[rank].communicate(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            out[rank] = "<still running>"
            continue
        lines = [ln for ln in err.decode(errors="replace").splitlines() if ln.strip()]
        failed = [ln for ln in lines if ln.startswith(f"rank {rank} failed: ")]
        out[rank] = failed[-1] if failed else (lines[-1] if lines else "")
    return out


class FaultJob:
    def __init__(
        self,
        tmp: Path,
        n: int,
        *,
        fault: str = "",
        op: str = "all_reduce",
        timeout_s: float = 2.0,
        iters: int = 8,
        job: str = "faults",
        pause_s: float = 0.3,
        buffers: str = "plain",
        hold_on_error: bool = True,
        rank0_hosts: bool = False,
        linger_s: float = 5.0,
        ranks: list[int] | None = None,
        default_dumps: bool = False,
        port: int | None = None,
        dump_dir: Path | None = None,
        extra: dict[str, str] | None = None,
    ) -> None:
        """``buffers="shared"``: the ranks' buffers come from ``comm.empty()`` (zero-copy).
        ``rank0_hosts``: no store of ours; rank 0 hosts the job's store on a free
        ``MASTER_PORT`` (a process of its own, lingering ``linger_s`` after the last rank).
        ``ranks``: start only these (in order). ``default_dumps``: no CCLCTL_TRACE_DIR, so
        the ranks dump into the job's own folder (``dump_dir``) under TMPDIR, which is
        ``tmp``. ``port``: rank 0's ``MASTER_PORT`` (default a free one). ``dump_dir``: the
        job's folder (default ``tmp/dumps``). ``extra``: more of the ranks' environment, last
        (``CCLCTL_ON_HANG`` is ``wait`` unless it says otherwise)."""
        self.n = n
        self.job = job
        self.tmpdir = tmp
        if default_dumps:
            self.dump_dir = Path(job_dir(job, {"TMPDIR": str(tmp)}))
        else:
            self.dump_dir = tmp / "dumps" if dump_dir is None else dump_dir
            self.dump_dir.mkdir(exist_ok=True)
        trace = {} if default_dumps else {"CCLCTL_TRACE_DIR": str(self.dump_dir)}
        self.server = None if rank0_hosts else StoreServer("127.0.0.1", 0, token=TOKEN).start()
        self.port = port or (free_port() if self.server is None else self.server.port)
        self.store = f"127.0.0.1:{self.port}"
        where = (
            {"MASTER_PORT": str(self.port), "CCLCTL_STORE_LINGER": str(linger_s)}
            if self.server is None
            else {"CCLCTL_STORE": self.store}
        )
        base = {k: v for k, v in os.environ.items() if not k.startswith("CCLCTL_")}
        self.procs: list[subprocess.Popen[bytes]] = []
        for rank in range(n) if ranks is None else ranks:
            env = {
                **base,
                "RANK": str(rank),
                "WORLD_SIZE": str(n),
                "LOCAL_RANK": str(rank),
                "LOCAL_WORLD_SIZE": str(n),
                "MASTER_ADDR": "127.0.0.1",
                **where,
                "CCLCTL_JOB": job,
                "CCLCTL_TOKEN": TOKEN,
                "CCLCTL_TIMEOUT": str(timeout_s),
                "CCLCTL_ON_HANG": "wait",
                "CCLCTL_STATUS_INTERVAL": "0.2",
                "CCLCTL_FAULT": fault,
                "FAULT_OP": op,
                "ITERS": str(iters),
                "PAUSE": str(pause_s),
                "HOLD_ON_ERROR": "1" if hold_on_error else "0",
                "FAULT_BUFFERS": buffers,
                "TMPDIR": str(tmp),
                **trace,
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

    def pid(self, rank: int) -> int:
        return self.procs[rank].pid

    def errors(self, ranks: list[int], timeout_s: float = 60.0) -> dict[int, str]:
        """Each of ``ranks``' error line once it has exited (before ``finish``)."""
        return error_lines(dict(enumerate(self.procs)), ranks, timeout_s)

    def wait_all_exited(self, timeout_s: float) -> list[int | None]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and any(p.poll() is None for p in self.procs):
            time.sleep(0.1)
        return [p.poll() for p in self.procs]

    def finish(self, grace_s: float = 5.0) -> None:
        """Terminate the survivors (they dump), then kill anything left and the store."""
        for p in self.procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
                os.killpg(p.pid, signal.SIGCONT)  # a stopped rank takes SIGTERM once resumed
        deadline = time.monotonic() + grace_s
        for p in self.procs:
            try:
                p.wait(max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(5)
        for p in self.procs:
            if p.stderr is not None:
                p.stderr.close()
        if self.server is not None:
            self.server.close()

    def kill_now(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(5)
        if self.server is not None:
            self.server.close()
