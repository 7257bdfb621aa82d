"""What a communicator hands telemetry: one record per call, opened and closed around it.

The runtime does not import telemetry's classes; it talks to any object with the
:class:`Tracer` shape (``cclctl.telemetry.recorder.Recorder`` is the real one).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Generic, Protocol, TypeVar

from cclctl import records
from cclctl.call_fault import fault_of
from cclctl.errors import CollectiveTimeout, CommAborted
from cclctl.records import CollectiveRecord

S = TypeVar("S")


class Tracer(Protocol):
    """Telemetry as the communicator sees it.

    ``start`` only queues the record, which counts as ended once :func:`close_record` has
    set its ``end_ns``; ``fold`` does the bookkeeping, and the communicator runs it every
    ``FOLD_BATCH`` calls.
    """

    start: Callable[[CollectiveRecord], None]

    def fold(self) -> None: ...


def close_record(rec: CollectiveRecord, exc: BaseException | None) -> None:
    """Stamp the end of a call on its record: completed, or how it failed and why.

    A failed call keeps ``waiting_on``/``waiting_for``: whom it waited on is evidence.
    ``end_ns`` is set last: telemetry, possibly folding in another thread, takes a record
    with ``end_ns`` set as ended and counts its state as it reads it then.
    """
    end_ns = time.time_ns()
    if exc is None:
        rec.waiting_on = None
        rec.waiting_for = None
        rec.state = records.COMPLETED
    else:
        rec.state = (
            records.TIMED_OUT
            if isinstance(exc, CollectiveTimeout)
            else records.ABORTED
            if isinstance(exc, CommAborted)
            else records.FAILED
        )
        rec.error = str(exc) or type(exc).__name__
        rec.fault = fault_of(exc)
    rec.end_ns = end_ns


class Traced(Generic[S]):
    """Context manager around one call: hands ``rec`` to ``start`` (a tracer's, or None)
    on entry and to ``on_exit`` (with the exception, if any) on exit; ``step`` is what
    ``with`` yields."""

    __slots__ = ("on_exit", "rec", "start", "step")

    def __init__(
        self,
        start: Callable[[CollectiveRecord], None] | None,
        rec: CollectiveRecord,
        step: S,
        on_exit: Callable[[CollectiveRecord, BaseException | None], None],
    ) -> None:
        self.start = start
        self.rec = rec
        self.step = step
        self.on_exit = on_exit

    def __enter__(self) -> S:
        if self.start is not None:
            self.start(self.rec)
        return self.step

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        self.on_exit(self.rec, exc)
