"""A stand-in for telemetry that keeps the records a communicator hands it."""

from __future__ import annotations

from collections.abc import Callable

from cclctl.records import CollectiveRecord


class RecordingTracer:
    """Satisfies the communicator's ``Tracer``: ``started`` and ``finished`` hold the records
    in call order; ``on_start`` runs on each record as it starts (e.g. to mark it later).
    """

    def __init__(self, on_start: Callable[[CollectiveRecord], None] | None = None) -> None:
        self.started: list[CollectiveRecord] = []
        self.finished: list[CollectiveRecord] = []
        self._on_start = on_start

    def start(self, rec: CollectiveRecord) -> None:
        self.started.append(rec)
        if self._on_start is not None:
            self._on_start(rec)

    def finish(self, rec: CollectiveRecord) -> None:
        self.finished.append(rec)

    def fold(self) -> None:
        pass
