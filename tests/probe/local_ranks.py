"""Ranks of `cclctl probe` started on this host the way srun or mpirun start them (each its
own process with RANK, WORLD_SIZE and MASTER_ADDR, rank 0 hosting the job's store), so a
test can act on one rank while the others go on: kill it, read its lines as they come.

Every wait has a deadline; ``close`` kills whatever still runs (each rank leads a session of
its own, so its children go with it).
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

TOKEN = "probe-local-token-0123456789abcdefghijkl"


class LocalRanks:
    """``world`` ranks running ``cclctl probe ARGS -J -`` against a store at ``port``."""

    def __init__(
        self, tmp: Path, world: int, port: int, *args: str, env: dict[str, str] | None = None
    ) -> None:
        base = {k: v for k, v in os.environ.items() if not k.startswith("CCLCTL_")}
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.procs: list[subprocess.Popen[str]] = []
        self._readers: list[threading.Thread] = []
        self._err0: list[str] = []
        for rank in range(world):
            renv = {
                **base, "TMPDIR": str(tmp), "RANK": str(rank), "WORLD_SIZE": str(world),
                "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": str(world),
                "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "CCLCTL_JOB": "probe",
                "CCLCTL_TOKEN": TOKEN, "CCLCTL_STORE_LINGER": "1", "CCLCTL_TIMEOUT": "60",
                **(env or {}),
            }  # fmt: skip
            cmd = [sys.executable, "-m", "cclctl", "probe", *args, "-J", "-"]
            proc = subprocess.Popen(cmd, env=renv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    text=True, start_new_session=True)  # fmt: skip
            self.procs.append(proc)
        self._out0: list[str] = []
        # rank 0's stderr line by line as it comes (the schedule's progress), and its stdout
        for target in (self._read_err0, self._read_out0):
            reader = threading.Thread(target=target, daemon=True)
            reader.start()
            self._readers.append(reader)

    def _read_err0(self) -> None:
        stream = self.procs[0].stderr
        assert stream is not None
        for line in stream:
            self._err0.append(line)
            self.lines.put(line)
        self.lines.put(None)  # rank 0 closed its stderr: no line will come

    def _read_out0(self) -> None:
        stream = self.procs[0].stdout
        assert stream is not None
        self._out0.append(stream.read())

    def wait_line(self, starts: str, timeout_s: float) -> str:
        """Rank 0's first stderr line from now that starts with ``starts``."""
        while True:
            try:
                line = self.lines.get(timeout=timeout_s)
            except queue.Empty:
                line = None
            if line is None:
                raise AssertionError(f"rank 0 never said {starts!r}: {''.join(self._err0)}")
            if line.startswith(starts):
                return line

    def signal(self, rank: int, signum: int) -> None:
        os.killpg(self.procs[rank].pid, signum)

    def finish(
        self, timeout_s: float, without: tuple[int, ...] = ()
    ) -> tuple[list[int | None], dict[str, Any], str]:
        """Every rank's exit code (None for the ranks ``without``, not waited for: stopped
        ones), rank 0's document and its stderr."""
        codes: list[int | None] = [self.procs[0].wait(timeout_s)]
        for rank, proc in enumerate(self.procs[1:], 1):
            if rank in without:
                codes.append(None)
                continue
            proc.communicate(timeout=timeout_s)
            codes.append(proc.returncode)
        for reader in self._readers:
            reader.join(timeout_s)
        out0, err0 = "".join(self._out0), "".join(self._err0)
        assert out0.strip(), f"rank 0 wrote no document (exit {codes[0]}): {err0}"
        return codes, json.loads(out0), err0

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
            for stream in (proc.stdout, proc.stderr):
                if stream is not None:
                    stream.close()
