"""The line protocol from rank 0 to the `cclctl bench` parent: one JSON object per line.

``{"event": "meta", "meta": {...}}`` once, ``{"event": "row", "row": {...}}`` per finished
row, ``{"event": "end", "finished_at": "..."}`` last. Lines that are not ours (a library
printing to stdout) are passed on rather than breaking the run.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from cclctl.benchmark.options import BenchOptions
from cclctl.benchmark.results import Row, RunMeta
from cclctl.errors import BadInput

_OPTION_KEYS = tuple(f.name for f in dataclasses.fields(BenchOptions))


def encode(event: str, **payload: Any) -> str:
    """One protocol line (without the newline)."""
    return json.dumps({"event": event, **payload}, separators=(",", ":"))


def meta_line(meta: RunMeta) -> str:
    return encode("meta", meta=meta.to_dict())


def row_line(row: Row) -> str:
    return encode("row", row=row.to_dict())


def end_line(finished_at: str) -> str:
    return encode("end", finished_at=finished_at)


def parse_meta(data: object) -> RunMeta:
    return RunMeta.from_dict(data, _OPTION_KEYS)


class Collector:
    """Rebuilds the run from rank 0's lines, in the parent."""

    def __init__(self) -> None:
        self.meta: RunMeta | None = None
        self.rows: list[Row] = []
        self.ended = False
        self.foreign: list[str] = []  # lines that were not protocol lines

    def feed(self, line: str) -> Row | None:
        """Take one line; returns the Row when the line finished one."""
        text = line.strip()
        if not text:
            return None
        try:
            message = json.loads(text)
        except ValueError:
            message = None
        if not isinstance(message, dict) or "event" not in message:
            self.foreign.append(text)
            return None
        event = message["event"]
        if event == "meta":
            self.meta = parse_meta(message.get("meta"))
        elif event == "row":
            row = Row.from_dict(message.get("row"))
            self.rows.append(row)
            return row
        elif event == "end":
            self.ended = True
            if self.meta is not None:
                self.meta = self.meta.finished(str(message.get("finished_at", "")))
        else:
            raise BadInput(f"unknown bench event {event!r} from rank 0", where="bench stream")
        return None
