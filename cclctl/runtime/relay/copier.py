"""How the relay moves bytes between a device and host memory: a small protocol.

The relay's pipeline (:mod:`.pipeline`) never touches a device itself. It asks a
:class:`Copier` to *start* a copy of a contiguous run of elements between a flat device
buffer (whatever the copier understands: a torch tensor, a numpy array) and a host array,
and gets back a :class:`CopyEvent` it waits on before it uses the host array (a load) or
reuses it (a store). A copier for an accelerator issues its copies asynchronously on a
copy stream, so they overlap the host collective; :class:`HostCopier` copies numpy arrays
at once, which runs the same pipeline on CPU buffers (``CCLCTL_STAGE=always``), and
:class:`ThreadCopier` copies them on a thread of its own, a copy engine's stand-in, so on
CPU too the copies overlap the host collective (numpy copies release the GIL).
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Any, Protocol

import numpy as np


class CopyEvent(Protocol):
    """A copy that has been started: :meth:`wait` blocks until its bytes have landed."""

    def wait(self) -> None: ...

    def elapsed_ns(self) -> int:
        """How long the copy itself took (valid once :meth:`wait` returned)."""
        ...


class Copier(Protocol):
    """Starts copies between a device buffer and host arrays, and makes staging memory."""

    def describe(self, buf: Any) -> tuple[int, np.dtype]:
        """``buf``'s element count and its elements' numpy dtype."""
        ...

    def staging(self, nbytes: int) -> np.ndarray:
        """A host buffer of ``nbytes`` bytes (uint8) the device copies to and from fastest
        (page-locked where the device supports it)."""
        ...

    def to_host(self, src: Any, offset: int, host: np.ndarray) -> CopyEvent:
        """Start copying ``src[offset : offset + host.size]`` into ``host``."""
        ...

    def to_device(self, host: np.ndarray, dst: Any, offset: int) -> CopyEvent:
        """Start copying ``host`` into ``dst[offset : offset + host.size]``."""
        ...


class DoneCopy:
    """A copy that finished before it was handed back (it took ``ns``)."""

    __slots__ = ("ns",)

    def __init__(self, ns: int) -> None:
        self.ns = ns

    def wait(self) -> None:
        return None

    def elapsed_ns(self) -> int:
        return self.ns


class HostCopier:
    """The copier of CPU buffers (flat numpy arrays): each copy runs at once, timed."""

    def describe(self, buf: Any) -> tuple[int, np.dtype]:
        return int(buf.size), buf.dtype

    def staging(self, nbytes: int) -> np.ndarray:
        return np.empty(nbytes, dtype=np.uint8)

    def to_host(self, src: Any, offset: int, host: np.ndarray) -> CopyEvent:
        t0 = time.perf_counter_ns()
        host[...] = src[offset : offset + host.size]
        return DoneCopy(time.perf_counter_ns() - t0)

    def to_device(self, host: np.ndarray, dst: Any, offset: int) -> CopyEvent:
        t0 = time.perf_counter_ns()
        dst[offset : offset + host.size] = host
        return DoneCopy(time.perf_counter_ns() - t0)


class ThreadCopy:
    """A copy queued to a :class:`ThreadCopier`; set once its bytes have landed."""

    __slots__ = ("_done", "error", "ns")

    def __init__(self) -> None:
        self._done = threading.Event()
        self.ns = 0
        self.error: BaseException | None = None

    def finish(self, ns: int, error: BaseException | None) -> None:
        self.ns, self.error = ns, error
        self._done.set()

    def wait(self) -> None:
        self._done.wait()
        if self.error is not None:
            raise self.error

    def elapsed_ns(self) -> int:
        return self.ns


class ThreadCopier(HostCopier):
    """Copies of CPU buffers run in order on one daemon thread (a copy engine's stand-in);
    :meth:`close` ends it."""

    def __init__(self) -> None:
        self._work: queue.SimpleQueue[tuple[np.ndarray, np.ndarray, ThreadCopy] | None] = (
            queue.SimpleQueue()
        )
        self._thread = threading.Thread(target=self._serve, name="cclctl-relay-copy", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while (item := self._work.get()) is not None:
            dst, src, event = item
            t0 = time.perf_counter_ns()
            try:
                dst[...] = src
            except BaseException as exc:  # handed to whoever waits on the copy
                event.finish(time.perf_counter_ns() - t0, exc)
            else:
                event.finish(time.perf_counter_ns() - t0, None)

    def _start(self, dst: np.ndarray, src: np.ndarray) -> CopyEvent:
        event = ThreadCopy()
        self._work.put((dst, src, event))
        return event

    def to_host(self, src: Any, offset: int, host: np.ndarray) -> CopyEvent:
        return self._start(host, src[offset : offset + host.size])

    def to_device(self, host: np.ndarray, dst: Any, offset: int) -> CopyEvent:
        return self._start(dst[offset : offset + host.size], host)

    def close(self) -> None:
        """End the copy thread once the copies queued before have run."""
        self._work.put(None)
        self._thread.join()
