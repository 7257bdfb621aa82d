"""When a torch call that returned early has really ended, so its record can be closed.

A synchronous call on CPU tensors ends at the ``wait()`` torch's API makes right after it
(``Work.wait`` is wrapped while instrumented). The rest ends later and is closed here:

- works with a future (``async_op=True``, DDP's buckets, FSDP, functional collectives): the
  communicator's lane waits on the future and closes the record (no callback runs on the
  backend's threads; see :mod:`~cclctl.integrations.torch.lanes`);
- works without a future (gloo's isend/irecv): at the work's ``wait()`` (``Work.wait`` is
  wrapped while instrumented), else when a poll finds ``is_completed()`` (a work nobody
  waits on must not look hung);
- CUDA tensors: CUDA events recorded around the call; the poll closes the record when the
  end event has passed and takes the duration from the events, not from the host clock.

Closing never raises into torch's threads: a failure to close is logged and dropped.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from cclctl.integrations.torch.lanes import Close, Lanes
from cclctl.records import CollectiveRecord

log = logging.getLogger("cclctl.torch")

#: Seconds between polls of pending works (CUDA events, works without a future).
POLL_S = 0.005


class _Pending:
    __slots__ = ("done", "elapsed_ns", "rec", "work")

    def __init__(
        self,
        rec: CollectiveRecord,
        done: Callable[[], bool],
        elapsed_ns: Callable[[], int] | None,
        work: Any,
    ) -> None:
        self.rec = rec
        self.done = done
        self.elapsed_ns = elapsed_ns
        self.work = work


class Completions:
    """Records whose calls returned before their work ended, and the ways they end."""

    def __init__(self, close: Close, poll_s: float = POLL_S) -> None:
        self._close = close
        self._poll_s = poll_s
        self._lock = threading.Lock()
        self._pending: dict[int, _Pending] = {}  # id(work or record) -> pending
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lanes = Lanes(close)

    def on_future(self, rec: CollectiveRecord, work: Any) -> bool:
        """Close ``rec`` when ``work``'s future completes, waited on in the communicator's
        lane (:mod:`~cclctl.integrations.torch.lanes`); False if it has no future."""
        try:
            future = work.get_future()
        except RuntimeError:  # "Work::getFuture not implemented" (gloo point-to-point)
            return False
        self._lanes.add(rec.comm, rec, future)
        return True

    def on_wait(self, rec: CollectiveRecord, work: Any) -> None:
        """Close ``rec`` at ``work.wait()``, which the caller makes next (a synchronous
        call); the poller is not woken for it, but finds it should the wait never come.
        No lock: one dict store is atomic under the GIL, and :meth:`poll` copies first."""
        self._pending[id(work)] = _Pending(rec, work.is_completed, None, work)

    def on_wait_or_poll(self, rec: CollectiveRecord, work: Any) -> None:
        """Close ``rec`` at ``work.wait()`` or when a poll finds the work completed."""
        self._add(id(work), _Pending(rec, work.is_completed, None, work))

    def on_events(self, rec: CollectiveRecord, start: Any, end: Any, work: Any = None) -> None:
        """Close ``rec`` when the CUDA event ``end`` (or ``work``) has completed; the
        duration is the events' elapsed time when they were both recorded on one stream.
        """
        if work is not None:
            self._add(id(work), _Pending(rec, work.is_completed, None, work))
            return

        def elapsed() -> int:
            return int(start.elapsed_time(end) * 1e6)

        self._add(id(rec), _Pending(rec, end.query, elapsed, None))

    def waited(self, work: Any, error: BaseException | None = None) -> None:
        """``work.wait()`` returned (or raised ``error``): its record ends now (called by
        the wrapped wait, also inside every synchronous torch call)."""
        if not self._pending:
            return
        pending = self._pending.pop(id(work), None)  # atomic under the GIL, as poll's pop
        if pending is not None:
            self._safe_close(pending.rec, error, 0)

    def poll(self) -> int:
        """Close every pending record whose work has completed; returns how many."""
        with self._lock:
            items = list(self._pending.items())
        closed = 0
        for key, pending in items:
            error: BaseException | None = None
            end_ns = 0
            try:
                if not pending.done():
                    continue
                if pending.elapsed_ns is not None:
                    end_ns = pending.rec.start_ns + pending.elapsed_ns()
            except Exception as exc:  # the work failed or the events cannot tell
                error = exc
            with self._lock:
                if self._pending.pop(key, None) is None:
                    continue  # closed meanwhile by wait()
            self._safe_close(pending.rec, error, end_ns)
            closed += 1
        return closed

    def pending(self) -> int:
        with self._lock:
            return len(self._pending)

    def close(self) -> None:
        """Stop polling; records still pending stay in flight (that is what they are)."""
        self._stop.set()
        self._wake.set()
        self._lanes.close()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)

    def _add(self, key: int, pending: _Pending) -> None:
        with self._lock:
            self._pending[key] = pending
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="cclctl-torch-completions", daemon=True
                )
                self._thread.start()
        self._wake.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            if not self.pending():
                self._wake.wait()
                self._wake.clear()
                continue
            self.poll()
            self._stop.wait(self._poll_s)  # close() ends the wait at once

    def _safe_close(self, rec: CollectiveRecord, error: BaseException | None, end_ns: int) -> None:
        try:
            self._close(rec, error, end_ns)
        except Exception:  # never into torch's callback thread
            log.exception("cclctl: closing the record of %s seq %s failed", rec.op, rec.seq)
