"""Shared-memory segments in ``/dev/shm``: create, map, unlink early, sweep what crashes left.

A segment's name embeds the job, the rank, the owner's pid and its pid namespace
(``cclctl-<job tag>-r<rank>-p<pid>-n<namespace>-<nonce>``). The owner unlinks it as soon
as every peer on the host has mapped it, so from then on the memory lives only in the
mappings and a ``kill -9`` of any rank leaks nothing. Only the few milliseconds of setup
can leave a file behind; :func:`sweep` removes segments whose owner is gone, and every job
runs it first.
Pids mean something only inside their namespace, so sweeps and liveness checks stay within
it, and ranks in different pid namespaces are not put on one host (see :func:`host_key`).
"""

from __future__ import annotations

import contextlib
import mmap
import os
import secrets
import zlib
from pathlib import Path

from cclctl.errors import CommError

SHM_DIR = Path("/dev/shm")
PREFIX = "cclctl-"


def available() -> bool:
    return SHM_DIR.is_dir() and os.access(SHM_DIR, os.W_OK)


def pid_namespace() -> int:
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


def host_key() -> str:
    """What ranks share when they can map each other's segments and see each other's pids:
    the running kernel (boot id), the very ``/dev/shm`` mount (its device number differs
    between containers) and the pid namespace.
    """
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        boot = "no-boot-id"
    try:
        dev = os.stat(SHM_DIR).st_dev
    except OSError:
        dev = -1
    return f"{boot}:{dev}:{pid_namespace()}"


def segment_name(job: str, rank: int) -> str:
    tag = zlib.crc32(job.encode())
    return f"{PREFIX}{tag:08x}-r{rank}-p{os.getpid()}-n{pid_namespace()}-{secrets.token_hex(4)}"


def owner_pid(name: str) -> int | None:
    """The pid embedded in a segment name, or None for a name cclctl did not make or one
    made in another pid namespace (where the pid names some other process).
    """
    if not name.startswith(PREFIX):
        return None
    fields = {part[:1]: part[1:] for part in name.split("-")[2:] if part[1:].isdigit()}
    if "p" not in fields or fields.get("n", "") != str(pid_namespace()):
        return None
    return int(fields["p"])


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie still answers kill(0): read its state
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def sweep() -> list[str]:
    """Remove cclctl segments whose owner process is gone; return their names."""
    removed: list[str] = []
    if not available():
        return removed
    with contextlib.suppress(OSError):
        for path in SHM_DIR.iterdir():
            pid = owner_pid(path.name)
            if pid is not None and not _alive(pid):
                with contextlib.suppress(OSError):
                    path.unlink()
                    removed.append(path.name)
    return removed


class Segment:
    """One mapping of a segment; the creator owns the name until it unlinks it."""

    def __init__(self, name: str, mm: mmap.mmap, owner: bool) -> None:
        self.name = name
        self.mm = mm
        self.owner = owner
        self._linked = owner

    @classmethod
    def create(cls, name: str, size: int) -> Segment:
        path = SHM_DIR / name
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        except OSError as exc:
            raise CommError(f"cannot create shared memory {path}: {exc.strerror}") from None
        try:
            os.ftruncate(fd, size)
            mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except OSError as exc:
            os.close(fd)
            with contextlib.suppress(OSError):
                path.unlink()
            raise CommError(f"cannot map shared memory {path} ({size} bytes): {exc}") from None
        os.close(fd)
        return cls(name, mm, owner=True)

    @classmethod
    def attach(cls, name: str) -> Segment:
        path = SHM_DIR / name
        try:
            fd = os.open(path, os.O_RDWR)
        except OSError as exc:
            raise CommError(f"cannot open shared memory {path}: {exc.strerror}") from None
        try:
            size = os.fstat(fd).st_size
            mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except OSError as exc:
            raise CommError(f"cannot map shared memory {path}: {exc}") from None
        finally:
            os.close(fd)
        return cls(name, mm, owner=False)

    def unlink(self) -> None:
        """Remove the name; the mappings (ours and the peers') stay valid."""
        if self._linked:
            self._linked = False
            with contextlib.suppress(FileNotFoundError):
                (SHM_DIR / self.name).unlink()

    def close(self) -> None:
        self.unlink()
        with contextlib.suppress(BufferError, ValueError):  # views still alive: GC unmaps
            self.mm.close()
