"""Where a rank called its collectives, from the ``frames`` of Flight Recorder entries.

PyTorch records the Python stack of each collective call (innermost frame first, as
``{"name", "filename", "line"}``; pickled dumps have them, JSON ones may not). It says where
the rank *was* when it called, not where it is now, so the stack cclctl makes of it names
that call (:attr:`cclctl.stack_records.ThreadStack.call`). Only the calls a diagnosis can point at
keep their frames: each group's oldest open call and the rank's newest call.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from cclctl.records import CollectiveRecord
from cclctl.stack_records import MAX_FRAMES, MAX_NAME, Frame, ThreadStack, clip, frame_from_dict

NAME = "Flight Recorder"


@dataclasses.dataclass(frozen=True, slots=True)
class Site:
    """One call's place: its group (by name), seq, whether point-to-point, op and frames
    (outermost first, the outer ``omitted`` cut)."""

    group: str
    seq: int
    p2p: bool
    op: str
    frames: tuple[Frame, ...]
    omitted: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "group": self.group,
            "seq": self.seq,
            "p2p": self.p2p,
            "op": self.op,
            "frames": [f.to_dict() for f in self.frames],
            "omitted": self.omitted,
        }


def site_from_dict(data: dict[str, Any]) -> Site:
    """A site as :meth:`Site.to_dict` wrote it (between this process and its readers)."""
    frames = tuple(frame_from_dict(f, "site") for f in data["frames"])
    return Site(data["group"], data["seq"], data["p2p"], data["op"], frames, data["omitted"])


def site_of(entry: dict[str, Any], group: str, seq: int, p2p: bool, op: str) -> Site | None:
    """The entry's call site, or None when it recorded no frames."""
    raw = entry.get("frames")
    if not isinstance(raw, list | tuple) or not raw:
        return None
    frames = [_frame(f) for f in raw[:MAX_FRAMES] if isinstance(f, dict)]
    if not frames:
        return None
    frames.reverse()
    return Site(group, seq, p2p, op, tuple(frames), max(0, len(raw) - MAX_FRAMES))


def _frame(raw: dict[str, Any]) -> Frame:
    line = raw.get("line")
    if isinstance(line, str) and line.strip().isdigit():
        line = int(line)
    number = line if isinstance(line, int) and not isinstance(line, bool) and line > 0 else 0
    return Frame(
        file=clip(str(raw.get("filename", "")), MAX_NAME),
        line=number,
        func=clip(str(raw.get("name", "")), MAX_NAME),
    )


def stack_of(site: Site, comm: str) -> ThreadStack:
    """The site as the stack of a rank's document, naming the call (``comm``: its id)."""
    call = f"{site.op} (point-to-point seq {site.seq})" if site.p2p else f"{site.op} seq {site.seq}"
    return ThreadStack(
        NAME, site.frames, main=True, omitted=site.omitted, call=f"{call} of comm {comm}"
    )


def call_site(
    sites: Sequence[Site], open_call: CollectiveRecord | None, ids: dict[str, str]
) -> list[ThreadStack]:
    """Where the rank called the call it is in (its oldest open one), else its newest
    (``sites``: the newest call first, then each group's oldest open call)."""
    if open_call is not None:
        for site in sites:
            same = (ids[site.group], site.seq, site.p2p)
            if same == (open_call.comm, open_call.seq, open_call.peer is not None):
                return [stack_of(site, ids[site.group])]
    return [stack_of(sites[0], ids[sites[0].group])] if sites else []
