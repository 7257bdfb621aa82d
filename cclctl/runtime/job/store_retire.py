"""A rerun on the port of a lingering store: ask that store to leave, once it is verified.

A job's store lingers ``CCLCTL_STORE_LINGER`` seconds after its last rank, on the job's
fixed ``MASTER_PORT``; a rerun's rank 0 would find the port taken. It looks for the pid file
(:mod:`cclctl.store.pidfile`) of a store on that port in the job's folder, beside it, and in
the folder holding this user's job folders, and signals the pid only if that process is
this user's, runs ``cclctl.store.detached`` and listens on the port. The store leaves only
if no rank uses it; a running job's store stays, and the rerun's error names that job.
"""

from __future__ import annotations

import dataclasses
import glob
import os
import signal
import time

from cclctl.errors import StoreError
from cclctl.store import pidfile

#: How long rank 0 waits for a lingering store to leave (and retries its bind).
RETIRE_TIMEOUT_S = 10.0
POLL_S = 0.05
STORE_ARGV = ("-m", "cclctl.store.detached")
TCP_LISTEN = "0A"


@dataclasses.dataclass(frozen=True)
class Holder:
    """A verified lingering store: its pid, port, job and pid file."""

    pid: int
    port: int
    job: str
    file: str


def find_holder(port: int, folders: list[str]) -> Holder | None:
    """This user's cclctl store listening on ``port``, found through its pid file under
    ``folders`` (each, and one level below each), verified on /proc; None if there is none."""
    for file in _candidates(port, folders):
        record = pidfile.read(file)
        if record is None or record["port"] != port:
            continue
        pid = int(record["pid"])
        if is_store_process(pid) and listens_on(pid, port):
            return Holder(pid, port, str(record.get("job", "?")), file)
    return None


def ask_to_leave(holder: Holder, address: str, deadline: float) -> None:
    """Signal the store to leave and wait until it no longer listens on the port; a
    StoreError naming its job if it stays (ranks still use it) or does not go in time."""
    asked_ns = time.time_ns()
    os.kill(holder.pid, signal.SIGUSR1)
    who = f"the store of job {holder.job!r} (pid {holder.pid})"
    while listens_on(holder.pid, holder.port):
        refused = _refusal(holder, asked_ns)
        if refused is not None:
            raise StoreError(
                f"cannot start the store on {address}: the port is held by {who}, and "
                f"{refused}; a running job's store is never taken away (give this job "
                f"another MASTER_PORT, or let that job end)",
                address=address,
                job=holder.job,
                pid=holder.pid,
            )
        if time.monotonic() > deadline:
            raise StoreError(
                f"cannot start the store on {address}: {who} was asked to leave the port "
                f"but still holds it after {RETIRE_TIMEOUT_S:g}s",
                address=address,
                job=holder.job,
                pid=holder.pid,
            )
        time.sleep(POLL_S)


def is_store_process(pid: int) -> bool:
    """``pid`` is this user's process running ``python -m cclctl.store.detached``."""
    try:
        if os.stat(f"/proc/{pid}").st_uid != os.getuid():
            return False
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            argv = tuple(a.decode(errors="replace") for a in handle.read().split(b"\0"))
    except OSError:
        return False
    return any(argv[i : i + 2] == STORE_ARGV for i in range(len(argv) - 1))


def listens_on(pid: int, port: int) -> bool:
    """``pid`` holds a TCP socket listening on ``port`` (IPv4 or IPv6)."""
    inodes = _listening_sockets(pid, port)
    if not inodes:
        return False
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") in inodes:
                return True
        except OSError:
            continue
    return False


def _listening_sockets(pid: int, port: int) -> set[str]:
    """The ``socket:[inode]`` names of TCP sockets listening on ``port`` in ``pid``'s
    network namespace (from its /proc/<pid>/net tables)."""
    inodes = set()
    for table in ("tcp", "tcp6"):
        try:
            with open(f"/proc/{pid}/net/{table}") as handle:
                rows = [row.split() for row in handle.read().splitlines()[1:]]
        except OSError:
            continue
        for fields in rows:
            listening = len(fields) > 9 and fields[3] == TCP_LISTEN
            if listening and int(fields[1].rpartition(":")[2], 16) == port:
                inodes.add(f"socket:[{fields[9]}]")
    return inodes


def _candidates(port: int, folders: list[str]) -> list[str]:
    """Pid files of stores on ``port``: in each folder and in its subfolders, each once."""
    name = os.path.basename(pidfile.path("", port))
    found: list[str] = []
    for folder in folders:
        below = sorted(glob.glob(os.path.join(glob.escape(folder), "*", name)))
        for file in [os.path.join(folder, name), *below]:
            file = os.path.abspath(file)  # symlinks stay: pidfile.read never follows one
            if file not in found and os.path.isfile(file):
                found.append(file)
    return found


def _refusal(holder: Holder, asked_ns: int) -> str | None:
    """Why the store declined to leave, if it recorded a refusal since ``asked_ns``."""
    record = pidfile.read(holder.file)
    refused = record.get("refused") if record is not None else None
    if not isinstance(refused, dict) or int(refused.get("time_ns", 0)) < asked_ns:
        return None
    members = int(refused.get("members", 0))
    if members:
        return f"{members} of its ranks are still connected"
    return "it started moments ago and its ranks have not connected yet"
