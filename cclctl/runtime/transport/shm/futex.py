"""Waking a rank that sleeps on shared memory: futex words, with a fence around the check.

Ranks on one host share counters in ``/dev/shm`` segments. A waiting rank spins on them
briefly (the peer usually answers within microseconds when each rank has a core), then
sleeps on a futex word in its *own* segment. A rank that publishes something checks, after a
full fence, whether any peer sleeps and only then pays for the ``futex_wake`` system call:
with fences on both sides (store, fence, load) one of the two always sees the other, so no
wake-up is lost and the common path costs no system call at all.

Python has no fence instruction, but acquiring and releasing an uncontended lock executes a
locked instruction, which is a full barrier on x86 and on arm64's acquire/release pairs.
``futex`` is reached through ``ctypes``; without it (not Linux) sleeps fall back to short
naps, which stay correct because every sleep is bounded.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform
import threading
import time

_SYS_FUTEX = {"x86_64": 202, "aarch64": 98, "arm64": 98, "ppc64le": 221, "s390x": 238}
_FUTEX_WAIT, _FUTEX_WAKE = 0, 1
_NAP_S = 50e-6  # fallback sleep when there is no futex


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class Futex:
    """``futex(2)`` on words of shared mappings (not private: keyed by file and offset)."""

    def __init__(self) -> None:
        self._nr = _SYS_FUTEX.get(platform.machine().lower())
        self._call = None
        if self._nr is not None and os.name == "posix":
            try:
                libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
                self._call = libc.syscall
                self._call.restype = ctypes.c_long
            except (OSError, AttributeError):
                self._call = None
        self._lock = threading.Lock()

    @property
    def available(self) -> bool:
        return self._call is not None

    def fence(self) -> None:
        """A full memory barrier (see the module docstring)."""
        with self._lock:
            pass

    def wait(self, address: int, expected: int, timeout_s: float) -> None:
        """Sleep while the u32 at ``address`` holds ``expected``, at most ``timeout_s``."""
        if self._call is None:
            time.sleep(min(timeout_s, _NAP_S))
            return
        sec = int(timeout_s)
        ts = _Timespec(sec, int((timeout_s - sec) * 1e9))
        self._call(
            self._nr, ctypes.c_void_p(address), _FUTEX_WAIT, expected, ctypes.byref(ts), None, 0
        )

    def wake(self, address: int) -> None:
        """Wake every sleeper on the u32 at ``address``."""
        if self._call is not None:
            self._call(self._nr, ctypes.c_void_p(address), _FUTEX_WAKE, 0x7FFFFFFF, None, None, 0)


def address_of(buffer: memoryview, offset: int) -> int:
    """The address of ``buffer[offset]`` (a writable mapping), for futex calls."""
    return ctypes.addressof(ctypes.c_char.from_buffer(buffer, offset))
