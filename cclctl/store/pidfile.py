"""Where a detached store says who it is: ``store-<port>.pid`` in its job's folder.

The store writes it (0600) once bound and removes it on exit; a rank 0 that finds the port
taken reads it to tell a lingering store of this user from anything else on the port (see
:mod:`cclctl.runtime.job.store_retire`). A store asked to leave while ranks still use it
records its refusal in the same file, so the asker fails at once, naming the job.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import time
from typing import Any

#: The most a pid file may hold; a larger one is not a store's.
MAX_BYTES = 4096


def path(folder: str, port: int) -> str:
    return os.path.join(folder, f"store-{port}.pid")


def write(folder: str, record: dict[str, Any]) -> None:
    """Write ``record`` (``pid``, ``port``, ``job``, ...) atomically, 0600."""
    target = path(folder, int(record["port"]))
    temp = f"{target}.{os.getpid()}.tmp"
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(json.dumps(record, sort_keys=True) + "\n")
    os.replace(temp, target)


def read(file: str) -> dict[str, Any] | None:
    """The record in ``file`` if it is a regular file of this user holding a store's record;
    None for anything else (missing, someone else's, malformed)."""
    try:
        fd = os.open(file, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(handle.fileno())
        if info.st_uid != os.getuid() or not stat.S_ISREG(info.st_mode):
            return None
        raw = handle.read(MAX_BYTES + 1)
    try:
        record = json.loads(raw) if len(raw) <= MAX_BYTES else None
    except ValueError:
        return None
    if not isinstance(record, dict):
        return None
    if not all(_positive_int(record.get(k)) for k in ("pid", "port")):
        return None
    return record


def refuse(folder: str, record: dict[str, Any], members: int) -> None:
    """Record that the store declined to leave: ``members`` ranks still use it."""
    with contextlib.suppress(OSError):
        write(folder, dict(record, refused={"members": members, "time_ns": time.time_ns()}))


def remove(folder: str, port: int, pid: int) -> None:
    """Remove the pid file if it still names ``pid`` (a newer store's is left alone)."""
    file = path(folder, port)
    record = read(file)
    if record is not None and record.get("pid") == pid:
        with contextlib.suppress(OSError):
            os.unlink(file)


def _positive_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0
