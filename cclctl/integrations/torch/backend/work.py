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
        self._progress = progress

    def wait(self, timeout: timedelta | None = None) -> bool:
        """Block until the call ends (running it here when it may start now); raise its
        error if it failed. (``timeout`` is cclctl's: ``CCLCTL_TIMEOUT`` expires a hung call
        through the runtime's watchdog.)"""
        self._progress.wait(self._entry)
        return True

    def get_future(self) -> torch.futures.Future[list[torch.Tensor]]:
        """The call's future: its output tensors, or its error."""
        return self._progress.future(self._entry)

    def is_completed(self) -> bool:
        return self._entry.done

    def is_success(self) -> bool:
        return self._entry.done and self._entry.error is None

    def exception(self) -> BaseException | None:
        """The call's error once it failed (None while it runs or when it succeeded)."""
        return self._entry.error if self._entry.done else None

    def result(self) -> list[torch.Tensor]:
        return self._progress.wait(self._entry)
