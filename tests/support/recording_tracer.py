"""A stand-in for telemetry that keeps the records a communicator hands it."""

from __future__ import annotations

from collections.abc import Callable

from cclctl.records import CollectiveRecord


class RecordingTracer:
    """Satisfies the communicator's ``Tracer``: ``started`` holds the records in call order
    and ``finished`` those that have ended (``end_ns`` set); ``on_start`` runs on each
    record as it starts (e.g. to mark it later).
    """

    def __init__(self, on_start: Callable[[CollectiveRecord], None] | None = None) -> None:
        self.started: list[CollectiveRecord] = []
        self._on_start = on_start

    @property
    def finished(self) -> list[CollectiveRecord]:
        return [rec for rec in self.started if rec.end_ns]

    def start(self, rec: CollectiveRecord) -> None:
        self.started.append(rec)
        if self._on_start is not None:
            self._on_start(rec)

    def fold(self) -> None:
        pass
