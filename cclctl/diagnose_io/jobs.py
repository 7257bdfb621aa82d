"""Find a job's dumps with no path given: the job folders under ``${TMPDIR:-/tmp}/cclctl-<uid>/``.

Every rank dumps into its job's folder unless ``CCLCTL_TRACE_DIR`` names another (see
:func:`cclctl.config.job_dir`), so ``cclctl diagnose hang`` with no argument reads the job
whose dumps are newest there, by their files' modification times. A folder holds the job's
token file beside its dumps; only dump files (``cclctl-<job>-rank<r>.json``) count. A folder
that is not this user's is passed over: in a shared ``/tmp`` another user could plant one.
"""

from __future__ import annotations

import dataclasses
import os
import stat

from cclctl.diagnose_io.inputs import DUMP_NAME
from cclctl.errors import BadInput


@dataclasses.dataclass(frozen=True)
class JobFolder:
    """One job's folder: its name (the job's, made safe for a file name), path, how many
    dump files it holds and the newest one's modification time."""

    name: str
    path: str
    dumps: int
    newest_ns: int


def read_folder(path: str) -> JobFolder | None:
    """The folder's dump files, or None when it holds none (or is not this user's)."""
    try:
        if os.stat(path).st_uid != os.geteuid():
            return None
        names = [n for n in os.listdir(path) if DUMP_NAME.match(n)]
    except OSError:
        return None
    times = []
    for name in names:
        try:
            info = os.stat(os.path.join(path, name), follow_symlinks=False)
        except OSError:
            continue
        if info.st_uid == os.geteuid() and stat.S_ISREG(info.st_mode):
            times.append(info.st_mtime_ns)
    if not times:
        return None
    return JobFolder(os.path.basename(os.path.normpath(path)), path, len(times), max(times))


def job_folders(base: str) -> list[JobFolder]:
    """The job folders under ``base`` that hold dumps, newest first (ties: by name)."""
    try:
        names = sorted(os.listdir(base))
    except OSError:
        return []
    found = (read_folder(os.path.join(base, name)) for name in names)
    folders = [f for f in found if f is not None]
    return sorted(folders, key=lambda f: (-f.newest_ns, f.name))


def newest_job(base: str) -> tuple[JobFolder, int]:
    """The job folder with the newest dumps under ``base``, and how many folders hold dumps;
    BadInput (one line, exit 2) when none does."""
    folders = job_folders(base)
    if not folders:
        raise BadInput(
            f"no job's dumps in {base}: give dump files or folders, or --store HOST:PORT "
            "(or CCLCTL_STORE) for a live job",
            path=base,
        )
    return folders[0], len(folders)


def named_job(path: str, job: str) -> JobFolder:
    """Job ``job``'s folder ``path``; BadInput naming it when it holds no dumps."""
    folder = read_folder(path)
    if folder is None:
        raise BadInput(f"no dumps of job {job!r} in {path}", path=path)
    return folder
