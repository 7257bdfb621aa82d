"""Cross-memory attach: this rank reads and writes its host peers' private memory.

Linux's ``process_vm_readv`` and ``process_vm_writev`` copy between two processes' address
spaces in one pass. Ranks of one host can so move a plain numpy array's bytes straight into
a peer's array, where the one-copy engine stages them through a slot of the sender's
segment and the reader copies them out again: two passes over memory instead of one. Open
MPI's shared-memory transport calls this single-copy (CMA).

The kernel allows it where the caller may ptrace the peer (the same user, and Yama's
``ptrace_scope`` 0 or a capability), unless a seccomp profile blocks the calls, and a pid
means the same process only within one pid namespace. So it is found out, never assumed:
each rank puts a random token in its segment with its address (:func:`offer`), reads every
peer's through the kernel at the pid and address that peer published, and says in its
segment whether all of them matched (:func:`probe`); the host's ranks use it only where
every one of them read every other's (:func:`agreed`), so they all decide alike.
"""

from __future__ import annotations

import ctypes
import errno
import os
import secrets
import threading
from collections.abc import Callable, Sequence

import numpy as np

from cclctl.runtime.peer_process import GONE
from cclctl.runtime.transport import wire
from cclctl.runtime.transport.shm.futex import address_of
from cclctl.runtime.transport.shm.host_peers import link_broke
from cclctl.runtime.transport.shm.layout import (
    Q_PROBE_ADDR,
    Q_PROBE_TOKEN,
    W_CROSS,
    W_PID,
    View,
)

CROSS_UNKNOWN, CROSS_YES, CROSS_NO = 0, 1, 2


class _Iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


_Call = Callable[[int, int, int, int, int, int], int]


def _bind() -> tuple[_Call, _Call] | None:
    """libc's two calls, typed (None where this libc has neither)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        calls = (libc.process_vm_readv, libc.process_vm_writev)
    except (OSError, AttributeError):
        return None
    for fn in calls:
        fn.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_ulong, ctypes.c_void_p,
                       ctypes.c_ulong, ctypes.c_ulong]  # fmt: skip
        fn.restype = ctypes.c_ssize_t
    return calls


_CALLS = _bind()


class _Mover:
    """One direction of the kernel's copy with its two reusable iovecs."""

    __slots__ = ("_fn", "_local", "_local_at", "_remote", "_remote_at")

    def __init__(self, fn: _Call) -> None:
        self._fn = fn
        self._local, self._remote = _Iovec(), _Iovec()
        self._local_at = ctypes.addressof(self._local)
        self._remote_at = ctypes.addressof(self._remote)

    def move(self, pid: int, local: int, remote: int, nbytes: int) -> int:
        """Copy ``nbytes`` between ``local`` here and ``remote`` in ``pid``; 0, or the errno
        of the first failure (a short copy is resumed; one that moves nothing is EFAULT)."""
        done = 0
        while done < nbytes:
            self._local.base, self._local.len = local + done, nbytes - done
            self._remote.base, self._remote.len = remote + done, nbytes - done
            got = self._fn(pid, self._local_at, 1, self._remote_at, 1, 0)
            if got <= 0:
                return ctypes.get_errno() if got < 0 else errno.EFAULT
            done += got
        return 0


class _Movers(threading.local):
    """Each thread's pair of movers (their iovecs are rewritten on every copy)."""

    def __init__(self) -> None:
        assert _CALLS is not None
        self.read, self.write = _Mover(_CALLS[0]), _Mover(_CALLS[1])


class CrossMemory:
    """This rank's reads from and writes to its host peers' memory, by global rank."""

    def __init__(self, rank: int, pids: dict[int, int]) -> None:
        self.rank = rank
        self._pids = pids
        self._movers = _Movers()

    def read(self, peer: int, remote: int, into: np.ndarray, call: wire.Call) -> None:
        """``into`` = ``into.nbytes`` bytes at ``remote`` in ``peer``'s memory."""
        err = self._movers.read.move(self._pids[peer], into.ctypes.data, remote, into.nbytes)
        if err:
            self._failed(peer, err, "read from", call)

    def write(self, peer: int, remote: int, data: np.ndarray, call: wire.Call) -> None:
        """``data``'s bytes to ``remote`` in ``peer``'s memory."""
        err = self._movers.write.move(self._pids[peer], data.ctypes.data, remote, data.nbytes)
        if err:
            self._failed(peer, err, "write to", call)

    def _failed(self, peer: int, err: int, what: str, call: wire.Call) -> None:
        """A peer's memory could not be reached: it exited (``ESRCH``), or its buffer is no
        longer where it said (it left the call), or the kernel now refuses."""
        gone = err == errno.ESRCH
        why = GONE if gone else os.strerror(err)
        text = f"rank {peer}'s process exited" if gone else f"cannot {what} its memory: {why}"
        raise link_broke(self.rank, peer, call, text, why)


def offer(me: View) -> None:
    """The owner: a random token in its segment, and where it lies in its own memory."""
    me.q[Q_PROBE_TOKEN] = secrets.randbits(64)
    me.q[Q_PROBE_ADDR] = address_of(me.mv, Q_PROBE_TOKEN * 8)


def probe(me: View, others: Sequence[View], enabled: bool = True) -> None:
    """Read every peer's token through the kernel and say in this rank's segment whether
    each matched (every peer has called :func:`offer` before its segment was named)."""
    ok = enabled and _CALLS is not None and all(_reads(view) for view in others)
    me.i[W_CROSS] = CROSS_YES if ok else CROSS_NO


def _reads(view: View) -> bool:
    assert _CALLS is not None
    token = np.zeros(1, np.uint64)
    err = _Mover(_CALLS[0]).move(view.i[W_PID], token.ctypes.data, view.q[Q_PROBE_ADDR], 8)
    return not err and int(token[0]) == view.q[Q_PROBE_TOKEN]


def agreed(rank: int, views: Sequence[View]) -> CrossMemory | None:
    """This rank's cross-memory engine where every rank of the host read every other's
    token (each has :func:`probe`\\ d: the caller has met them all since), else None."""
    if any(view.i[W_CROSS] != CROSS_YES for view in views):
        return None
    return CrossMemory(rank, {view.rank: view.i[W_PID] for view in views if view.rank != rank})
