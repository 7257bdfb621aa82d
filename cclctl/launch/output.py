"""Follow every rank's stdout and stderr from one thread, line by line.

One selector thread instead of two threads per rank: a 1024-rank launch stays one extra
thread, and lines reach the callback one at a time, so callbacks need no lock.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import shlex
import threading
from collections.abc import Callable
from typing import IO

#: (rank, "stdout" | "stderr", line without its newline)
LineSink = Callable[[int, str, str], None]

READ_BYTES = 1 << 16
MAX_LINE_BYTES = 1 << 20  # a longer run without a newline is passed on in pieces


def where_to_watch(store: str, job: str) -> list[str]:
    """The lines a launcher prints at start: the job's store, then the ``cclctl top`` and
    ``cclctl diagnose hang`` commands to paste, each whole on its own line."""
    where = f"--store {shlex.quote(store)} --job {shlex.quote(job)}"
    return [
        f"cclctl: job {job} store {store}; watch it or find what hangs it with:",
        f"  cclctl top {where}",
        f"  cclctl diagnose hang {where}",
    ]


class OutputPump:
    """Reads the registered pipes until each reaches end of file; see :meth:`join`."""

    def __init__(self, sink: LineSink) -> None:
        self._sink = sink
        self._selector = selectors.DefaultSelector()
        self._partial: dict[int, bytearray] = {}
        self._thread: threading.Thread | None = None
        self._stop = False
        #: The first exception a sink raised; the launcher re-raises it once ranks are down.
        self.error: BaseException | None = None

    def add(self, pipe: IO[bytes], rank: int, stream: str) -> None:
        fd = pipe.fileno()
        os.set_blocking(fd, False)
        self._partial[fd] = bytearray()
        self._selector.register(fd, selectors.EVENT_READ, (pipe, rank, stream))

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="cclctl-launch-output", daemon=True)
        self._thread.start()

    def join(self, timeout_s: float) -> None:
        """Wait for end of file on every pipe; past the timeout, stop reading anyway.

        A process outside the ranks' process groups may hold a pipe open forever (a daemon a
        rank left behind); the launcher must still return.
        """
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._stop = True
            self._thread.join(1.0)
        for key in list(self._selector.get_map().values()):
            self._close(key.fd, key.data)
        self._selector.close()

    def _run(self) -> None:
        while not self._stop and self._selector.get_map():
            for key, _ in self._selector.select(timeout=0.2):
                self._read(key.fd, key.data)

    def _read(self, fd: int, data: tuple[IO[bytes], int, str]) -> None:
        try:
            chunk = os.read(fd, READ_BYTES)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if not chunk:
            self._close(fd, data)
            return
        buffer = self._partial[fd]
        buffer += chunk
        _, rank, stream = data
        *lines, rest = buffer.split(b"\n")
        while len(rest) > MAX_LINE_BYTES:
            lines.append(rest[:MAX_LINE_BYTES])
            rest = rest[MAX_LINE_BYTES:]
        self._partial[fd] = bytearray(rest)
        for line in lines:
            self._deliver(rank, stream, line)

    def _close(self, fd: int, data: tuple[IO[bytes], int, str]) -> None:
        pipe, rank, stream = data
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(fd)
        rest = self._partial.pop(fd, b"")
        if rest:
            self._deliver(rank, stream, bytes(rest))
        pipe.close()

    def _deliver(self, rank: int, stream: str, raw: bytes | bytearray) -> None:
        if self.error is not None:
            return  # keep draining so ranks never block on a full pipe
        line = raw.decode("utf-8", errors="replace").rstrip("\r")
        try:
            self._sink(rank, stream, line)
        except BaseException as exc:
            self.error = exc
