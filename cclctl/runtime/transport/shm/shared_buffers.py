"""Buffers that ranks on one host read from each other directly (zero-copy collectives).

:func:`empty` allocates a numpy array in an anonymous memory file (``memfd``) of this
process. A peer on the same host opens that file through ``/proc/<pid>/fd/<fd>`` and maps it,
so a collective whose buffers all come from here skips the copy into the shared-memory
slots: in an all_reduce each rank reduces its share straight out of every peer's input and
writes it straight into every peer's output (``algorithms/zero_copy.py``). Inputs are
mapped read-only; only outputs a collective writes into are mapped writable.
This is what a CPU-relay staging buffer should be: memory the library owns, so that peers
can read it. (NCCL calls the same idea buffer registration; PyTorch, symmetric memory.)

Nothing gets a name in ``/dev/shm``: the memory goes away with the last process that maps
it, so a crash leaks nothing. A buffer lives as long as any array that views it.
"""

from __future__ import annotations

import bisect
import collections
import contextlib
import dataclasses
import mmap
import os
import struct
import threading
import weakref
from typing import Any

import numpy as np

from cclctl.errors import InvalidArgument, ProtocolError

_DESC = struct.Struct("<iiQQQ")
#: Bytes of one packed :class:`Descriptor`.
DESCRIPTOR_SIZE = _DESC.size
#: Peers' buffers kept mapped per process (least recently used ones are unmapped first).
MAX_PEER_MAPS = 64


@dataclasses.dataclass(frozen=True, slots=True)
class Descriptor:
    """Where a peer finds an array: process, file descriptor, the buffer's token (checked
    against the file's name, so a reused fd number is never taken for the buffer), and
    the array's byte range in the file."""

    pid: int
    fd: int
    token: int
    offset: int
    nbytes: int

    def pack(self) -> bytes:
        return _DESC.pack(self.pid, self.fd, self.token, self.offset, self.nbytes)

    @classmethod
    def unpack(cls, data: bytes | memoryview) -> Descriptor:
        return cls(*_DESC.unpack(data))


@dataclasses.dataclass(frozen=True, slots=True)
class CallDescriptors:
    """Where a zero-copy call's arrays lie, as its peers find them: one descriptor each
    (a :class:`~cclctl.runtime.transport.engines.BufferPlan`)."""

    descs: list[Descriptor]

    def pack(self) -> bytes:
        return b"".join(d.pack() for d in self.descs)


@dataclasses.dataclass(slots=True)
class _Buffer:
    start: int
    size: int
    fd: int
    token: int


class _Registry:
    """This process's shared buffers, found by address (so views and slices work too)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._starts: list[int] = []
        self._buffers: dict[int, _Buffer] = {}

    def __bool__(self) -> bool:
        return bool(self._starts)

    def empty(self, shape: Any, dtype: Any) -> np.ndarray:
        dt = np.dtype(dtype)
        count = int(np.prod(shape, dtype=np.int64))
        if count < 0:
            raise InvalidArgument(f"empty: negative shape {shape}", op="empty")
        nbytes = max(count * dt.itemsize, 1)
        token = int.from_bytes(os.urandom(8), "little") >> 1
        fd = os.memfd_create(f"cclctl-buf-{token}", os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, nbytes)
            mm = mmap.mmap(fd, nbytes)
        except BaseException:
            os.close(fd)
            raise
        arr = np.frombuffer(mm, dtype=dt, count=count).reshape(shape)
        start = arr.__array_interface__["data"][0] if count else _address(mm)
        buf = _Buffer(start, nbytes, fd, token)
        self._register(buf)
        weakref.finalize(mm, self._forget, start, fd, token)
        return arr

    def _register(self, buf: _Buffer) -> None:
        """Add ``buf``, first dropping any buffer its range overlaps.

        Python unmaps an mmap before it runs the finalizer that forgets it, and lets other
        threads run in between, so a new buffer can be mapped at the same addresses while
        the old one is still registered. An overlap can only be such a buffer, already
        unmapped; left in place it would describe the new array with the old file.
        """
        end = buf.start + buf.size
        with self._lock:
            starts, buffers = self._starts, self._buffers
            i = bisect.bisect_right(starts, buf.start)
            if i and starts[i - 1] + buffers[starts[i - 1]].size > buf.start:
                i -= 1  # the buffer below reaches into this one
            while i < len(starts) and starts[i] < end:
                del buffers[starts.pop(i)]
            bisect.insort(starts, buf.start)
            buffers[buf.start] = buf

    def _forget(self, start: int, fd: int, token: int) -> None:
        """The last array viewing the buffer is gone: drop it, unless a new buffer has
        taken its place already (see :meth:`_register`), and close its file."""
        with self._lock:
            buf = self._buffers.get(start)
            if buf is not None and buf.token == token:
                del self._buffers[start]
                self._starts.pop(bisect.bisect_left(self._starts, start))
        os.close(fd)

    def describe(self, arr: np.ndarray) -> Descriptor | None:
        """The descriptor of ``arr`` (contiguous) if it lies inside one shared buffer."""
        addr = arr.__array_interface__["data"][0]
        with self._lock:
            i = bisect.bisect_right(self._starts, addr) - 1
            if i < 0:
                return None
            buf = self._buffers[self._starts[i]]
        offset = addr - buf.start
        if offset + arr.nbytes > buf.size:
            return None
        return Descriptor(os.getpid(), buf.fd, buf.token, offset, arr.nbytes)


def _address(mm: mmap.mmap) -> int:
    view = np.frombuffer(mm, dtype=np.uint8)
    address = int(view.__array_interface__["data"][0])
    del view
    return address


_registry = _Registry()


def empty(shape: Any, dtype: Any = np.float32) -> np.ndarray:
    """A new, uninitialised array that peers on this host can read directly."""
    return _registry.empty(shape, dtype)


def zeros(shape: Any, dtype: Any = np.float32) -> np.ndarray:
    """A new zeroed array that peers on this host can read directly. A memfd starts
    zero-filled, so this costs no pass over the memory beyond what :func:`empty` costs."""
    return _registry.empty(shape, dtype)


def in_use() -> bool:
    """Whether this process holds any shared buffer (if not, nothing needs looking up)."""
    return bool(_registry)


def describe(arr: np.ndarray) -> Descriptor | None:
    """Where peers find ``arr``, or None when it is not inside a shared buffer."""
    return _registry.describe(arr)


def plan(*arrays: np.ndarray) -> CallDescriptors | None:
    """The plan for a call on ``arrays`` when every one lies in a shared buffer; else None."""
    if not in_use():
        return None
    descs = []
    for arr in arrays:
        desc = describe(arr)
        if desc is None:
            return None
        descs.append(desc)
    return CallDescriptors(descs)


class PeerBuffers:
    """Peers' shared buffers, mapped on first use and kept for later calls: read-only, or
    writable where a collective writes its results into a peer's output (all_reduce).

    The arrays handed out are remembered by the packed descriptor that named them: a peer
    that names the same range of the same buffer again (a training loop's buffers, call
    after call) gets the same array back without a lookup, which matters because
    everything the lookup touches is cold after a large call's copies.
    """

    descriptor_size = DESCRIPTOR_SIZE

    def __init__(self, limit: int = MAX_PEER_MAPS) -> None:
        self._maps: collections.OrderedDict[tuple[int, int, bool], mmap.mmap] = (
            collections.OrderedDict()
        )
        self._views: dict[tuple[bytes, np.dtype, bool], np.ndarray] = {}
        self._limit = limit

    def array(
        self, packed: bytes, dtype: np.dtype, peer: int, writable: bool = False
    ) -> np.ndarray:
        """The bytes the packed :class:`Descriptor` names as an array of ``dtype``,
        read-only unless ``writable``; ProtocolError if the buffer cannot be opened or does
        not hold that range."""
        view = self._views.get((packed, dtype, writable))
        if view is not None:
            return view
        desc = Descriptor.unpack(packed)
        key = (desc.pid, desc.token, writable)
        mm = self._maps.get(key)
        if mm is None:
            mm = self._maps[key] = self._open(desc, peer, writable)
            while len(self._maps) > self._limit:
                self._views.clear()  # an unmapped buffer's views must not be handed out
                _close(self._maps.popitem(last=False)[1])
        else:
            self._maps.move_to_end(key)
        if desc.offset + desc.nbytes > len(mm):
            raise ProtocolError(
                f"peer {peer} named bytes {desc.offset}-{desc.offset + desc.nbytes} of a "
                f"shared buffer of {len(mm)} bytes",
                peer=peer,
            )
        count = desc.nbytes // dtype.itemsize
        view = np.frombuffer(mm, dtype=dtype, count=count, offset=desc.offset)
        if len(self._views) >= self._limit:
            self._views.clear()
        self._views[(packed, dtype, writable)] = view
        return view

    @staticmethod
    def _open(desc: Descriptor, peer: int, writable: bool) -> mmap.mmap:
        path = f"/proc/{desc.pid}/fd/{desc.fd}"
        try:
            name = os.readlink(path)
            if not name.startswith(f"/memfd:cclctl-buf-{desc.token} "):
                raise OSError(f"{path} is {name!r}, not the buffer the peer named")
            fd = os.open(path, (os.O_RDWR if writable else os.O_RDONLY) | os.O_CLOEXEC)
            try:
                return mmap.mmap(fd, 0, access=mmap.ACCESS_WRITE if writable else mmap.ACCESS_READ)
            finally:
                os.close(fd)
        except OSError as exc:
            raise ProtocolError(
                f"cannot map peer {peer}'s shared buffer ({exc}); shared buffers need the "
                "ranks of a host to run as one user and see each other's /proc",
                peer=peer,
            ) from None

    def close(self) -> None:
        self._views.clear()
        while self._maps:
            _close(self._maps.popitem()[1])


def _close(mm: mmap.mmap) -> None:
    # BufferError: an array still views it, and it is unmapped when that array goes
    with contextlib.suppress(BufferError):
        mm.close()
