"""Limits on the sizes that untrusted input states: world sizes, ranks, files.

A dump, a status or a store key is written by someone else, and a number in it must never
decide how much a reader allocates: ``diagnose`` and ``top`` make one entry per rank of the
world size, so a 2 KB document claiming a billion ranks would exhaust memory before any
verdict. Each size is checked here, against what no real job exceeds, before it is used,
and refused with :class:`TooLarge` (exit 2, one line). Standard library only.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable

from cclctl.errors import BadInput

#: No job has more ranks (100,000 and some room): every rank number and world size read from
#: input stays below it.
MAX_WORLD_SIZE = 1 << 17
#: A dump file larger than this is refused before any byte of it is read (a ring of 2,000
#: records with every thread's stack is a few MB).
MAX_FILE_BYTES = 256 << 20


#: Communicator members one read (every status of a job, every dump of a folder) may
#: expand to in all, counting each distinct list once: a folded range is a few bytes.
MAX_MEMBERS_READ = 16 * MAX_WORLD_SIZE


class TooLarge(BadInput):
    """A size read from input (a world size, a rank, a file's length) beyond any real job's.

    Unlike other problems with one rank's status, it is never set aside as that rank's
    problem: it would decide how much every reader allocates, so the input is refused.
    """


#: Integers in a document (times in ns, pids, counts) fit a signed 64-bit word, as every
#: writer's do; a larger one (JSON allows thousands of digits) is refused before it is used.
MAX_INT = (1 << 63) - 1


def world_size(size: int, where: str) -> int:
    """``size`` if it is a world size a reader may allocate for: BadInput below 1, TooLarge
    over :data:`MAX_WORLD_SIZE`."""
    if size < 1:
        raise BadInput(f"{where}: world size {size} is not a world size (1 or more)", where=where)
    if size > MAX_WORLD_SIZE:
        raise TooLarge(
            f"{where}: world size {size:,} is over the limit of {MAX_WORLD_SIZE:,} ranks",
            where=where,
        )
    return size


def rank(number: int, where: str, what: str = "rank") -> int:
    """``number`` if it can be a rank of a job within :data:`MAX_WORLD_SIZE`."""
    if number < 0:
        raise BadInput(f"{where}: {what} {number} is not a rank (0 or more)", where=where)
    if number >= MAX_WORLD_SIZE:
        raise TooLarge(
            f"{where}: {what} {number:,} is over the limit of {MAX_WORLD_SIZE:,} ranks",
            where=where,
        )
    return number


class MemberBudget:
    """Counts the distinct member lists of one read against :data:`MAX_MEMBERS_READ`."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.total = 0
        self._seen: set[int] = set()

    def add(self, lists: Iterable[list[int]]) -> None:
        """Count the lists not seen yet (by identity: parsed lists are shared)."""
        for members in lists:
            if id(members) not in self._seen:
                self._seen.add(id(members))
                self.total += len(members)
        if self.total > MAX_MEMBERS_READ:
            raise TooLarge(
                f"{self.what} name over {MAX_MEMBERS_READ:,} communicator members in all"
            )


def file_size(fd: int, path: str, what: str = "a dump") -> int:
    """The size of the open file ``fd``, checked before it is read: over
    :data:`MAX_FILE_BYTES`, or sparse (a hole before its end: zeros no writer of dumps
    leaves, and a cheap way to make a huge file), it is TooLarge.
    """
    stat = os.fstat(fd)
    size = stat.st_size
    if size > MAX_FILE_BYTES:
        raise TooLarge(
            f"{path}: {size:,} bytes, too large for {what} (the limit is {MAX_FILE_BYTES:,})",
            path=path,
        )
    hole = _first_hole(fd, size)
    if hole < size:
        raise TooLarge(
            f"{path}: a sparse file ({size:,} bytes, a hole at byte {hole:,}), not {what}",
            path=path,
        )
    return size


def _first_hole(fd: int, size: int) -> int:
    """Where the file's first hole starts (``size``: none, or the system cannot tell)."""
    seek_hole = getattr(os, "SEEK_HOLE", None)
    if seek_hole is None or size == 0:
        return size
    try:
        return os.lseek(fd, 0, seek_hole)
    except OSError:
        return size
    finally:
        with contextlib.suppress(OSError):
            os.lseek(fd, 0, os.SEEK_SET)
