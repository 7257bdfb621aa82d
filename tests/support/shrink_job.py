"""A shrink test's job: bare rank processes of ``shrink_worker.py`` around a store of ours.

Nothing stops the other ranks when one dies, as in a real job, so the survivors' shrink is
what lets them finish. ``finish`` SIGKILLs whatever is left (a stopped rank included) and
closes the store.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from fault_job import TOKEN

from cclctl.store.client import StoreServer

WORKER = str(Path(__file__).with_name("shrink_worker.py"))


class ShrinkJob:
    """``n`` ranks running ``iters`` exact all_reduces (see ``shrink_worker.py``)."""

    def __init__(
        self, tmp: Path, n: int, *, iters: int = 12, job: str = "shrinkjob",
        worker: str = WORKER, **env: str,
    ) -> None:  # fmt: skip
        """``worker``: the rank's script (default ``shrink_worker.py``)."""
        self.n = n
        self.out = tmp / "out"
        self.out.mkdir(exist_ok=True)
        self.server = StoreServer("127.0.0.1", 0, token=TOKEN).start()
        self.store = f"127.0.0.1:{self.server.port}"
        self.job = job
        self.stderr: dict[int, str] = {}  # each rank's, once outcome() read it
        self.stdout: dict[int, str] = {}
        base = {k: v for k, v in os.environ.items() if not k.startswith("CCLCTL_")}
        self.procs = [
            subprocess.Popen(
                [sys.executable, worker],
                env={
                    **base,
                    "RANK": str(rank),
                    "WORLD_SIZE": str(n),
                    "LOCAL_RANK": str(rank),
                    "LOCAL_WORLD_SIZE": str(n),
                    "MASTER_ADDR": "127.0.0.1",
                    "CCLCTL_STORE": self.store,
                    "CCLCTL_JOB": self.job,
                    "CCLCTL_TOKEN": TOKEN,
                    "CCLCTL_TIMEOUT": "10",
                    "CCLCTL_STATUS_INTERVAL": "0.2",
                    "CCLCTL_TRACE_DIR": str(self.out),
                    "OUT": str(self.out),
                    "ITERS": str(iters),
                    "TMPDIR": str(tmp),
                    **env,
                },
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )
            for rank in range(n)
        ]

    def wait_line(self, rank: int, text: str) -> None:
        """Read ``rank``'s stdout until a line holds ``text`` (it prints one per
        iteration; pytest-timeout bounds a rank that never gets there)."""
        stdout = self.procs[rank].stdout
        assert stdout is not None
        for line in stdout:
            if text in line.decode():
                return
        raise AssertionError(f"rank {rank} ended before printing {text!r}")

    def kill(self, rank: int, sig: signal.Signals = signal.SIGKILL) -> None:
        os.kill(self.procs[rank].pid, sig)

    def outcome(self, ranks: list[int], timeout_s: float = 60.0) -> dict[int, dict[str, object]]:
        """Each of ``ranks``' final document, once it exited 0 (else its stderr, failing)."""
        docs = {}
        for rank in ranks:
            proc = self.procs[rank]
            out, err = proc.communicate(timeout=timeout_s)
            self.stdout[rank] = out.decode(errors="replace")
            self.stderr[rank] = err.decode(errors="replace")
            assert proc.returncode == 0, (
                f"rank {rank} exit {proc.returncode}: {err.decode()[-2000:]}"
            )
            docs[rank] = json.loads((self.out / f"rank{rank}.json").read_text())
        return docs

    def finish(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
            for pipe in (proc.stdout, proc.stderr):
                if pipe is not None:
                    pipe.close()
        self.server.close()


def contribution(ranks: list[int]) -> int:
    """What one iteration's all_reduce sums per ``i + 1`` over ``ranks``."""
    return sum(r + 1 for r in ranks)
