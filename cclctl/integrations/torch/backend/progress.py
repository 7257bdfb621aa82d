"""A process group's progress thread: its calls run there, one at a time, in issue order.

torch's API returns a ``Work`` at once (``async_op=True``) or waits on it; either way the
call runs here, so a group's calls keep the order every rank issued them in (the runtime's
seq), whoever waits on them, and the caller's thread only hands the call over. The thread
completes each call's future: with its result, whose callbacks (DDP's hooks) then run on
this thread, or with the error the call raised.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable

import torch

Result = list[torch.Tensor]
_Job = tuple[Callable[[], Result], "torch.futures.Future[Result]"]


class Progress:
    """One daemon thread that runs a group's calls in the order they were submitted."""

    def __init__(self, name: str) -> None:
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._closed = False
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, job: Callable[[], Result]) -> torch.futures.Future[Result]:
        """Queue ``job``; its future completes once it ran (after every earlier job)."""
        future: torch.futures.Future[Result] = torch.futures.Future()
        with self._lock:
            if self._closed:
                raise RuntimeError("the cclctl process group was destroyed")
            self._jobs.put((job, future))
        return future

    def close(self) -> None:
        """Run what is queued, then end the thread (idempotent)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._jobs.put(None)
        if threading.current_thread() is not self._thread:
            self._thread.join()

    def _run(self) -> None:
        while (item := self._jobs.get()) is not None:
            job, future = item
            try:
                result = job()
            except BaseException as exc:  # the caller's wait() raises it
                future.set_exception(exc)  # type: ignore[arg-type]  # torch types it as T
            else:
                future.set_result(result)
