"""Wake the launcher the moment a rank ends, instead of at its next poll.

A pidfd (Linux 5.3+) becomes readable when its process exits, zombie or not, so the
launcher sees a death as soon as the kernel does and is the first to record it. Where
pidfds are missing the wait is a plain sleep of the same length.
"""

from __future__ import annotations

import contextlib
import os
import select
import time


class ExitWaiter:
    """One pidfd per watched process, opened once and closed when it is forgotten."""

    def __init__(self) -> None:
        self._fds: dict[int, int] = {}  # key (a rank) -> pidfd
        self._usable = hasattr(os, "pidfd_open")

    def watch(self, key: int, pid: int) -> None:
        if not self._usable:
            return
        try:
            self._fds[key] = os.pidfd_open(pid)
        except OSError:  # not allowed here (seccomp, old kernel): sleep instead
            self._usable = False
            self.close()

    def forget(self, key: int) -> None:
        fd = self._fds.pop(key, None)
        if fd is not None:
            os.close(fd)

    def wait(self, timeout_s: float) -> None:
        """Return when a watched process ends, or after ``timeout_s``."""
        if not self._usable or not self._fds:
            time.sleep(timeout_s)
            return
        waiter = select.poll()
        for fd in self._fds.values():
            waiter.register(fd, select.POLLIN)
        waiter.poll(timeout_s * 1000)

    def close(self) -> None:
        for fd in self._fds.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        self._fds.clear()
