"""The ``Work`` a cclctl process group returns: a handle on one call its progress runs.

torch waits on it (``work.wait()``, the synchronous API does so at once) or chains on its
future (``work.get_future()``: DDP's communication hooks). Both see the call's outcome: the
output tensors, or the error cclctl raised (a typed error with its fields: rank, peer,
comm, seq, op), raised again as it is by ``wait()``. A wait on a call that has not started
and may start now runs it on the waiting thread (:meth:`.progress.Progress.run_here`).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from cclctl.integrations.torch.backend.progress import Entry, Progress

#: torch's Work, subclassed through its trampoline (its stubs do not type that)
_Work: Any = dist._Work


class CclctlWork(_Work):
    """One call of a cclctl process group, completed by one of its lanes (or its waiter)."""

    def __init__(self, entry: Entry, op: str, progress: Progress) -> None:
        super().__init__()
        self.op = op
        self._entry = entry
        self._future = entry.future
        self._progress = progress

    def wait(self, timeout: timedelta | None = None) -> bool:
        """Block until the call ends; raise its error if it failed. (``timeout`` is
        cclctl's: ``CCLCTL_TIMEOUT`` expires a hung call through the runtime's watchdog.)"""
        if not self._entry.done:
            self._progress.run_here(self._entry)
        self._future.wait()
        return True

    def get_future(self) -> torch.futures.Future[list[torch.Tensor]]:
        """The call's future: its output tensors, or its error."""
        return self._future

    def is_completed(self) -> bool:
        return self._future.done()

    def is_success(self) -> bool:
        if not self._future.done():
            return False
        try:
            self._future.value()
        except Exception:
            return False
        return True

    def exception(self) -> BaseException | None:
        """The call's error once it failed (None while it runs or when it succeeded)."""
        if not self._future.done():
            return None
        try:
            self._future.value()
        except Exception as exc:
            return exc
        return None

    def result(self) -> list[torch.Tensor]:
        self.wait()
        return self._future.value()
