"""Reading many Flight Recorder dumps on several cores.

Unpickling is most of the cost of a dump (a 2,000-entry ring with stack frames is millions
of small objects), and it holds the GIL, so hundreds of dumps are split among forked
reader processes. Each child parses its share, condenses every dump (a few dozen records)
and sends that back as JSON over a pipe: nothing is pickled between processes, and a child
that dies costs a clear error, not a hang. There is one reader per CPU this process may
use (more would only add memory and contention). Where fork is missing, with one CPU, or
for a few files, the dumps are read here, one after the other.
"""

from __future__ import annotations

import dataclasses
import json
import operator
import os
from collections.abc import Callable, Sequence
from typing import Any

from cclctl.diagnose_io.fr_stacks import site_from_dict
from cclctl.diagnose_io.fr_translate import Group, RankDump
from cclctl.errors import BadInput, CclError
from cclctl.records import CollectiveRecord

#: Fewer files than this are read in this process (forking costs more than it saves).
MIN_FILES = 32
#: Reader processes at most: each holds one parsed dump (tens of MB) at a time.
MAX_WORKERS = 8
#: A record's fields in order: records travel as JSON lists (cheaper than ``asdict`` each).
_FIELDS = tuple(f.name for f in dataclasses.fields(CollectiveRecord))
_values = operator.attrgetter(*_FIELDS)

Read = Callable[[str, str], RankDump]


def read_all(
    files: Sequence[tuple[str, str]], read: Read, workers: int | None = None
) -> list[RankDump]:
    """``read(path, fmt)`` for every file; BadInput of the first unusable file (by path)."""
    n = min(workers or cores(), MAX_WORKERS, len(files))
    if n <= 1 or len(files) < MIN_FILES or not hasattr(os, "fork"):
        return [read(path, fmt) for path, fmt in files]
    children = [_spawn(files[i::n], read) for i in range(n)]
    dumps: list[RankDump] = []
    errors: list[tuple[str, str]] = []
    for pid, fd in children:
        with os.fdopen(fd, "r", encoding="utf-8") as pipe:
            text = pipe.read()
        os.waitpid(pid, 0)
        try:
            doc = json.loads(text)
        except ValueError:
            raise CclError("a Flight Recorder reader process died (out of memory?)") from None
        errors += [(e["path"], e["message"]) for e in doc["errors"]]
        dumps += [_from_dict(d) for d in doc["dumps"]]
    if errors:
        path, message = min(errors)
        raise BadInput(message, path=path)
    return dumps


def cores() -> int:
    """The CPUs this process may run on: a container's or ``taskset``'s share, which
    ``os.cpu_count()`` (the whole host) overstates."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0)) or 1
    return os.cpu_count() or 1


def _spawn(files: Sequence[tuple[str, str]], read: Read) -> tuple[int, int]:
    r, w = os.pipe()
    pid = os.fork()
    if pid:
        os.close(w)
        return pid, r
    os.close(r)  # the child: read its share, answer, leave without running exit hooks
    out: dict[str, list[Any]] = {"dumps": [], "errors": []}
    try:
        for path, fmt in files:
            try:
                out["dumps"].append(_to_dict(read(path, fmt)))
            except BadInput as exc:
                out["errors"].append({"path": path, "message": exc.message})
        with os.fdopen(w, "w", encoding="utf-8") as pipe:
            pipe.write(json.dumps(out))
    finally:
        os._exit(0)


def _to_dict(d: RankDump) -> dict[str, Any]:
    groups = {
        name: {
            "desc": g.desc,
            "started": g.started,
            "completed": g.completed,
            "records": [_values(r) for r in g.records],
        }
        for name, g in d.groups.items()
    }
    return {
        "rank": d.rank,
        "path": d.path,
        "fmt": d.fmt,
        "version": d.version,
        "time_ns": d.time_ns,
        "entries": d.entries,
        "members": d.members,
        "groups": groups,
        "sites": [s.to_dict() for s in d.sites],
    }


def _from_dict(data: dict[str, Any]) -> RankDump:
    groups = {
        name: Group(
            name,
            g["desc"],
            g["started"],
            g["completed"],
            records=[CollectiveRecord(*r) for r in g["records"]],
        )
        for name, g in data["groups"].items()
    }
    return RankDump(
        data["rank"],
        data["path"],
        data["fmt"],
        data["version"],
        data["time_ns"],
        data["entries"],
        groups,
        data["members"],
        [site_from_dict(s) for s in data["sites"]],
    )
