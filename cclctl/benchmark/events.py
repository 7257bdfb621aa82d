"""The line protocol from rank 0 to the `cclctl bench` parent: one JSON object per line.

``{"event": "meta", "meta": {...}}`` once, then ``{"event": "rank", "rank": {...}}`` per
rank (kept apart so no line grows with the world size past the launcher's line limit),
``{"event": "row", "row": {...}}`` per finished row, ``{"event": "end", "finished_at": ...}``
last. Lines that are not ours (a library printing to stdout) are passed on, not fatal.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from cclctl.benchmark.options import BenchOptions
from cclctl.benchmark.results import RankInfo, Row, RunMeta
from cclctl.errors import BadInput

_OPTION_KEYS = tuple(f.name for f in dataclasses.fields(BenchOptions))


def encode(event: str, **payload: Any) -> str:
    """One protocol line (without the newline)."""
    return json.dumps({"event": event, **payload}, separators=(",", ":"))


def meta_lines(meta: RunMeta) -> list[str]:
    """The run's metadata, then one line per rank."""
    head = encode("meta", meta=dataclasses.replace(meta, ranks=()).to_dict())
    return [head, *(encode("rank", rank=dataclasses.asdict(info)) for info in meta.ranks)]


def row_line(row: Row) -> str:
    return encode("row", row=row.to_dict())


def end_line(finished_at: str) -> str:
    return encode("end", finished_at=finished_at)


def parse_meta(data: object) -> RunMeta:
    return RunMeta.from_dict(data, _OPTION_KEYS)


class Collector:
    """Rebuilds the run from rank 0's lines, in the parent."""

    def __init__(self) -> None:
        self._meta: RunMeta | None = None
        self._ranks: list[RankInfo] = []
        self._finished_at = ""
        self.rows: list[Row] = []
        self.ended = False
        self.foreign: list[str] = []  # lines that were not protocol lines

    @property
    def meta(self) -> RunMeta | None:
        """The run's metadata with every rank heard of so far; None before the meta line."""
        if self._meta is None:
            return None
        meta = dataclasses.replace(self._meta, ranks=tuple(self._ranks))
        return meta.finished(self._finished_at) if self.ended else meta

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
            self._meta = parse_meta(message.get("meta"))
        elif event == "rank":
            self._ranks.append(RankInfo.from_dict(message.get("rank")))
        elif event == "row":
            row = Row.from_dict(message.get("row"))
            self.rows.append(row)
            return row
        elif event == "end":
            self.ended = True
            self._finished_at = str(message.get("finished_at", ""))
        else:
            raise BadInput(f"unknown bench event {event!r} from rank 0", where="bench stream")
        return None
