"""Dump files: their names, written atomically, and what an earlier run left removed.

A dump must be readable even if the process dies while writing it, so it goes to a temporary
file in the same directory and is renamed over the final name. A temporary file's name says
which process of which host writes it, so a later run can tell one left by a process that is
gone from one still being written.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import tempfile

from cclctl.errors import CclError

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def dump_filename(job: str, rank: int) -> str:
    """``cclctl-<job>-rank<r>.json``, with anything unsafe in a file name replaced by ``_``."""
    return f"cclctl-{_UNSAFE.sub('_', job) or 'job'}-rank{rank}.json"


#: Temporary files this process is writing now (a termination removes what it cuts short).
_WRITING: set[str] = set()


def tmp_prefix(pid: int | None = None) -> str:
    """``.cclctl-<host>-<pid>-``: whose a temporary file is, so a later run on this host
    can tell one left by a process that is gone (killed mid-write) from one being written."""
    host = _UNSAFE.sub("_", socket.gethostname()) or "host"
    return f".cclctl-{host}-{os.getpid() if pid is None else pid}-"


def write_atomic(path: str, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file and a rename (never half a file).

    A missing folder is made readable by its owner only (0700), as the file is (0600): a
    dump holds every thread's stack, and the job's folder its token. The temporary file is
    removed on every way out but a kill (:func:`remove_stale` clears those).
    """
    directory = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=tmp_prefix(), suffix=".tmp")
    except OSError as exc:
        raise CclError(f"cannot write dump {path}: {exc.strerror or exc}", path=path) from None
    _WRITING.add(tmp)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except OSError as exc:
        _remove_quietly(tmp)
        raise CclError(f"cannot write dump {path}: {exc.strerror or exc}", path=path) from None
    except BaseException:  # KeyboardInterrupt, SystemExit: no half-written file stays
        _remove_quietly(tmp)
        raise
    finally:
        _WRITING.discard(tmp)


def cut_short() -> None:
    """Remove the temporary files of writes still under way (the process is ending)."""
    for tmp in list(_WRITING):
        _remove_quietly(tmp)


def _dead_writers_tmp(directory: str, names: list[str]) -> list[str]:
    """Temporary files in ``directory`` left by processes of this host that are gone."""
    head = re.escape(tmp_prefix(0)[: -len("0-")])  # .cclctl-<host>-
    owned = re.compile(f"^{head}([0-9]{{1,9}})-.*\\.tmp$")
    left = []
    for name in names:
        match = owned.match(name)
        if match and not _alive(int(match[1])):
            left.append(os.path.join(directory, name))
    return left


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # another user's: alive
    return True


def remove_stale(directory: str, job: str, rank: int, world_size: int) -> list[str]:
    """Remove what an earlier run of ``job`` left in ``directory`` that this rank answers for
    (job names repeat: ``default``, ``bench``); returns the paths removed.

    Every rank removes its own file, so a rank that dies before it dumps is not read from an
    earlier run's document, and the temporary files of writers on this host that were killed
    mid-write (their pid is gone); rank 0 also removes the files of ranks ``world_size`` and
    beyond, which no rank of this run would replace.
    """
    mine = os.path.join(directory, dump_filename(job, rank))
    stale = [mine] if os.path.isfile(mine) else []
    try:
        names = os.listdir(directory)
    except OSError:
        names = []
    stale += _dead_writers_tmp(directory, names)
    if rank == 0:
        head = re.escape(dump_filename(job, 0)[: -len("0.json")])  # cclctl-<job>-rank
        numbered = re.compile(f"^{head}([0-9]+)\\.json$")
        found = (numbered.match(name) for name in names)
        stale += [os.path.join(directory, m[0]) for m in found if m and int(m[1]) >= world_size]
    removed = []
    for path in sorted(stale):
        try:
            os.unlink(path)
        except OSError:
            continue  # gone already, or not this user's to remove
        removed.append(path)
    return removed


def _remove_quietly(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)
