"""Threads that wait on works' futures, so no cclctl code runs on the backend's threads.

A callback on a gloo future runs on the gloo worker thread that completed the work, and a
Python callback must take the GIL there: while the caller runs Python (DDP's forward, the
next step's code), that worker waits for the GIL and the group's next work waits behind it.
Instead each communicator has a lane: a thread that takes the communicator's works in
issue order and waits on each future with the GIL released (``Future.wait``), then closes
the record. The backend's threads never wait for cclctl.

Works of one group complete in about the order they were issued; one that completes before
an earlier one is closed when the earlier one completes (its end time is late by at most
that gap). A lane blocked on a work that never completes is a hang, and the records behind
it are in flight, as they are.
"""

from __future__ import annotations

import collections
import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from cclctl.records import CollectiveRecord

log = logging.getLogger("cclctl.torch")

#: Closes a record: (record, error or None, end_ns or 0 for "now").
Close = Callable[[CollectiveRecord, BaseException | None, int], None]


class _Lane:
    """One communicator's works in issue order, and whether its thread sleeps: a work
    added while the thread waits on an earlier one needs no wake-up (one less switch for
    the caller, who issues DDP's buckets back to back)."""

    __slots__ = ("idle", "stopped", "wake", "works")

    def __init__(self) -> None:
        self.works: collections.deque[tuple[CollectiveRecord, Any]] = collections.deque()
        self.wake: queue.SimpleQueue[bool] = queue.SimpleQueue()
        self.idle = True
        self.stopped = False


class Lanes:
    """One waiting thread per communicator, started at its first work."""

    def __init__(self, close: Close) -> None:
        self._close = close
        self._lock = threading.Lock()
        self._lanes: dict[str, _Lane] = {}
        self._threads: list[threading.Thread] = []
        self._stopped = False

    def add(self, comm: str, rec: CollectiveRecord, future: Any) -> None:
        """Close ``rec`` when ``future`` completes (failed: with its error)."""
        lane = self._lanes.get(comm)
        if lane is None:
            lane = self._open(comm)
        lane.works.append((rec, future))
        if lane.idle:  # else its thread finds the work when it looks again (see _run)
            lane.idle = False
            lane.wake.put(True)

    def _open(self, comm: str) -> _Lane:
        with self._lock:
            lane = self._lanes.get(comm)
            if lane is None:
                lane = self._lanes[comm] = _Lane()
                if not self._stopped:
                    thread = threading.Thread(
                        target=self._run, args=(lane,), name=f"cclctl-torch-lane {comm}",
                        daemon=True,
                    )  # fmt: skip
                    self._threads.append(thread)
                    thread.start()
        return lane

    def _run(self, lane: _Lane) -> None:
        while True:
            if not lane.works:
                if lane.stopped:
                    return
                lane.idle = True
                if not lane.works and not lane.stopped:  # else added meanwhile: no sleep
                    lane.wake.get()
                lane.idle = False
                continue
            rec, future = lane.works.popleft()
            error: BaseException | None = None
            try:
                future.wait()  # the GIL is released while it waits
            except Exception as exc:
                error = exc
            try:
                self._close(rec, error, 0)
            except Exception:  # a lane must outlive a failed close
                log.exception("cclctl: closing the record of %s seq %s failed", rec.op, rec.seq)

    def close(self, timeout_s: float = 1.0) -> None:
        """End every lane once it has waited out its works; one blocked on a work that never
        completes is left behind (a daemon thread), never waited for."""
        with self._lock:
            self._stopped = True
            lanes, threads = list(self._lanes.values()), list(self._threads)
        for lane in lanes:
            lane.stopped = True
            lane.wake.put(True)
        deadline = time.monotonic() + timeout_s
        for thread in threads:
            if thread is not threading.current_thread():
                thread.join(max(0.0, deadline - time.monotonic()))
