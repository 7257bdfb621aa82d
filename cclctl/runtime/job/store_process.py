"""Rank 0 starts the job's store as a process of its own, which outlives rank 0.

The store (``python -m cclctl.store.detached``) runs in a session of its own with its
stdio on /dev/null and its notices in ``store.log`` in the job's folder, so it holds none of
rank 0's pipes (a ``subprocess.run(capture_output=True)`` of the job returns when the ranks
do). The token reaches it on a pipe, never in its arguments; it answers on another pipe
once bound. It serves while any rank is connected and ``CCLCTL_STORE_LINGER`` seconds more,
so ``cclctl top`` and ``cclctl diagnose hang --store`` still answer after rank 0 died.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import select
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any

from cclctl.config import StoreServerConfig, inherited_environment, jobs_dir
from cclctl.errors import CclError, StoreError
from cclctl.runtime.job import store_retire
from cclctl.store.client import StoreClient
from cclctl.store.scope import job_prefix
from cclctl.telemetry.counters import StoreCounts

ANY_ADDRESSES = ("0.0.0.0", "::")
#: How long rank 0 waits for its store process to say it is bound.
START_TIMEOUT_S = 30.0
#: The store process's notices, in the job's folder.
LOG_NAME = "store.log"
#: The key (in the job's scope) where the store process keeps what it turned away.
REPORT_KEY = "store/process"
#: Rank 0 reads those counts at most this often (statuses and scrapes both ask).
COUNTS_EVERY_S = 1.0
#: A read of the counts waits no longer than this: a scrape must not hang on the store.
COUNTS_TIMEOUT_S = 2.0

_log = logging.getLogger(__name__)


class DetachedStore:
    """The store process rank 0 started: where it listens, its pid, and what it turned
    away (read from the store itself). Closing this handle leaves the store running."""

    def __init__(self, host: str, port: int, pid: int, job: str, token: str) -> None:
        self.host = host
        self.port = port
        self.pid = pid
        self._key = job_prefix(job) + REPORT_KEY
        self._token = token
        self._lock = threading.Lock()
        self._reader: StoreClient | None = None
        self._counts = StoreCounts({}, 0)
        self._read_at = float("-inf")
        self._closed = False

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def counts(self) -> StoreCounts:
        """The store's closed connections by reason and refused requests, as it last
        published them (at most ``COUNTS_EVERY_S`` old; the last known if it is gone)."""
        with self._lock:
            if self._closed or time.monotonic() - self._read_at < COUNTS_EVERY_S:
                return self._counts
            self._read_at = time.monotonic()
            with contextlib.suppress(CclError, ValueError):
                self._counts = self._read()
            return self._counts

    @property
    def rejected(self) -> dict[str, int]:
        return self.counts().rejected

    @property
    def refused(self) -> int:
        return self.counts().refused

    def close(self) -> None:
        """Drop the connection that reads the counts; the store serves on, then lingers."""
        with self._lock:
            self._closed = True
            if self._reader is not None:
                self._reader.close()
                self._reader = None

    def _read(self) -> StoreCounts:
        if self._reader is None:
            self._reader = StoreClient(
                self.host,
                self.port,
                timeout_s=COUNTS_TIMEOUT_S,
                connect_timeout_s=COUNTS_TIMEOUT_S,
                token=self._token or None,
            )
        raw = self._reader.try_get(self._key)
        if raw is None:
            return self._counts
        report = json.loads(raw)
        rejected = {str(k): int(v) for k, v in dict(report.get("rejected", {})).items()}
        return StoreCounts(rejected, int(report.get("refused", 0)))


def spawn_store(
    bind: str, port: int, token: str, hosting: StoreServerConfig, *, job: str, folder: str,
    first_rank_s: float = 0.0,
) -> DetachedStore:  # fmt: skip
    """Start the job's store process on ``bind:port``; return it once it is bound. While
    no rank came it serves at least ``first_rank_s`` (a launcher's store starts first).

    A port it cannot bind is a StoreError naming the address, as for a store in-process,
    unless a lingering store of this user holds it with no rank connected: that store is
    asked to leave (:mod:`cclctl.runtime.job.store_retire`) and the bind is retried.
    """
    deadline = time.monotonic() + store_retire.RETIRE_TIMEOUT_S
    while True:
        try:
            return _spawn(bind, port, token, hosting, job=job, folder=folder, first=first_rank_s)
        except StoreError as exc:
            if port == 0 or exc.fields.get("errno") != errno.EADDRINUSE:
                raise
            folders = [folder, os.path.dirname(folder.rstrip(os.sep)), jobs_dir()]
            holder = store_retire.find_holder(port, folders)
            if holder is None or time.monotonic() > deadline:
                raise StoreError(
                    f"{exc.message} (no lingering cclctl store of yours was found on it)",
                    **exc.fields,
                ) from None
            store_retire.ask_to_leave(holder, f"{bind}:{port}", deadline)
            _log.info("the lingering store of job %r (pid %d) left port %d for this job",
                     holder.job, holder.pid, port)  # fmt: skip


def _spawn(
    bind: str, port: int, token: str, hosting: StoreServerConfig, *, job: str, folder: str,
    first: float,
) -> DetachedStore:  # fmt: skip
    """One start of the store process; a StoreError (with the bind's ``errno``) if it
    could not bind."""
    log = _open_log(folder)  # creates the job's folder, where the pid file goes
    spec = {
        "bind": bind,
        "port": port,
        "token": token,
        "max_frame": hosting.max_frame,
        "linger_s": hosting.linger_s,
        "first_rank_s": first,
        "report_key": job_prefix(job) + REPORT_KEY,
        "job": job,
        "folder": folder if log != subprocess.DEVNULL else "",
    }
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "cclctl.store.detached"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log,
            start_new_session=True,
            env=_environment(),
        )
    finally:
        if log != subprocess.DEVNULL:
            os.close(log)
    assert proc.stdin is not None and proc.stdout is not None
    try:
        with contextlib.suppress(BrokenPipeError):  # it died at once: its answer says why
            proc.stdin.write(json.dumps(spec).encode() + b"\n")
            proc.stdin.close()
        answer = _answer(proc.stdout, f"{bind}:{port}", folder)
    finally:
        proc.stdout.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(START_TIMEOUT_S)  # the first process exits as the store forks off
    if "error" in answer:
        raise StoreError(
            str(answer["error"]),
            address=str(answer.get("address", "")),
            errno=int(answer.get("errno", 0) or 0),
        )
    host = str(answer["host"])
    host = "127.0.0.1" if host in ANY_ADDRESSES else host  # where rank 0 connects
    return DetachedStore(host, int(answer["port"]), int(answer["pid"]), job, token)


def _answer(stream: IO[bytes], address: str, folder: str) -> dict[str, Any]:
    """The store process's one line: bound (host, port, pid) or why not (error)."""
    ready, _, _ = select.select([stream], [], [], START_TIMEOUT_S)
    line = stream.readline(4096) if ready else b""
    try:
        answer = json.loads(line)
    except ValueError:
        answer = None
    if not isinstance(answer, dict) or not ("error" in answer or "port" in answer):
        why = "did not answer in time" if not ready else "ended before it was ready"
        raise StoreError(
            f"cannot start the store on {address}: its process {why} "
            f"(see {os.path.join(folder, LOG_NAME)})",
            address=address,
        )
    return answer


def _open_log(folder: str) -> int:
    """The store's log, appended to (0600); /dev/null where the job's folder is not ours."""
    try:
        os.makedirs(folder, mode=0o700, exist_ok=True)
        return os.open(
            os.path.join(folder, LOG_NAME), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600
        )
    except OSError:
        return subprocess.DEVNULL


def _environment() -> dict[str, str]:
    """Rank 0's environment, with the folder it imported cclctl from first on the path."""
    env = inherited_environment()
    root = str(Path(__file__).resolve().parents[3])  # holds cclctl/runtime/job/ (this)
    rest = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != root]
    env["PYTHONPATH"] = os.pathsep.join([root, *rest])
    return env
