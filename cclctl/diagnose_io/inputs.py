"""Gather what ``cclctl diagnose hang`` hands the pure engine: dumps from files and folders,
or a live job's statuses, as one :class:`Inputs`.

Problems with the input are the user's to fix and say which file and why (BadInput, exit 2):
a path that does not exist, a folder without dumps, a file that is not a dump, dumps of
several jobs. Two dumps of one rank are not an error: the newest wins and the evidence says
so, since re-running a job into the same trace folder is common.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Callable, Collection, Sequence

from cclctl import limits
from cclctl.diagnose_io.dumpfile import fail, read_dump
from cclctl.errors import BadInput
from cclctl.live.snapshot import JobStatuses
from cclctl.records import RankSnapshot

#: What the telemetry hub names its dumps (see cclctl.telemetry.dumps.dump_filename).
DUMP_NAME = re.compile(r"^cclctl-.+-rank[0-9]+\.json$")


@dataclasses.dataclass
class Inputs:
    """Documents for the engine, one per rank, and what the engine should know about them."""

    snapshots: list[RankSnapshot]
    source: str  # "dumps" or "live"
    now_ns: int | None = None
    world_size: int | None = None
    unreadable: dict[int, str] = dataclasses.field(default_factory=dict)
    notes: dict[int, str] = dataclasses.field(default_factory=dict)
    files: int = 0
    remarks: list[str] = dataclasses.field(default_factory=list)  # about the input as a whole


def dump_paths(paths: Sequence[str], elsewhere: Collection[str] = ()) -> list[str]:
    """Files as given, and the dump files (``cclctl-<job>-rank<r>.json``) inside folders.

    ``elsewhere``: paths another reader has (PyTorch Flight Recorder dumps, and the folders
    holding them): such a file is skipped, such a folder may hold no cclctl dump.
    """
    out: list[str] = []
    for path in paths:
        if os.path.normpath(path) in elsewhere and not os.path.isdir(path):
            continue
        if os.path.isdir(path):
            try:
                names = sorted(n for n in os.listdir(path) if DUMP_NAME.match(n))
            except OSError as exc:
                raise fail(path, f"cannot list the folder ({exc.strerror or exc})") from None
            found = [os.path.join(path, n) for n in names if os.path.isfile(os.path.join(path, n))]
            if not found and os.path.normpath(path) not in elsewhere:
                raise fail(path, "no cclctl dumps (cclctl-<job>-rank<r>.json) in this folder")
            out += found
        elif os.path.isfile(path):
            out.append(path)
        elif os.path.exists(path):
            raise fail(path, "not a regular file")
        else:
            raise fail(path, "no such file or folder")
    return list(dict.fromkeys(out))  # a file named twice is read once


def load_dumps(
    paths: Sequence[str],
    job: str | None = None,
    progress: Callable[[int], None] | None = None,
) -> Inputs:
    """Read every dump; ``progress(files_done)`` is called after each file."""
    files = dump_paths(paths)
    by_file: list[tuple[str, RankSnapshot]] = []
    shared: dict[tuple[int, ...], list[int]] = {}
    budget = limits.MemberBudget("the dumps")
    for done, path in enumerate(files, 1):
        snap = read_dump(path)
        for info in snap.comms.values():  # one list per distinct member list, not per rank
            info.ranks = shared.setdefault(tuple(info.ranks), info.ranks)
        budget.add(info.ranks for info in snap.comms.values())
        by_file.append((path, snap))
        if progress is not None:
            progress(done)
    by_file = _one_job(by_file, job)
    snapshots, notes = _newest(by_file)
    return Inputs(snapshots, "dumps", notes=notes, files=len(files))


def _one_job(
    by_file: list[tuple[str, RankSnapshot]], job: str | None
) -> list[tuple[str, RankSnapshot]]:
    jobs: dict[str, list[str]] = {}
    for path, snap in by_file:
        jobs.setdefault(snap.job, []).append(os.path.basename(path))
    if job is not None:
        kept = [(p, s) for p, s in by_file if s.job == job]
        if not kept:
            raise BadInput(
                f"no dump of job {job!r} among {len(by_file)} files (jobs: {_list(jobs)})"
            )
        return kept
    if len(jobs) > 1:
        raise BadInput(
            f"the dumps come from {len(jobs)} jobs: {_list(jobs)}; pass one job's dumps or "
            "choose one with --job",
            jobs=sorted(jobs),
        )
    return by_file


def _list(jobs: dict[str, list[str]]) -> str:
    parts = []
    for name in sorted(jobs):
        files = jobs[name]
        shown = ", ".join(files[:2]) + (f" and {len(files) - 2} more" if len(files) > 2 else "")
        parts.append(f"{name!r} ({shown})")
    return "; ".join(parts)


def _newest(
    by_file: list[tuple[str, RankSnapshot]],
) -> tuple[list[RankSnapshot], dict[int, str]]:
    """One snapshot per rank, the newest by its own clock (ties: the later file name)."""
    ranks: dict[int, list[tuple[str, RankSnapshot]]] = {}
    for path, snap in by_file:
        ranks.setdefault(snap.rank, []).append((path, snap))
    kept: list[RankSnapshot] = []
    notes: dict[int, str] = {}
    for rank in sorted(ranks):
        options = sorted(ranks[rank], key=lambda ps: (ps[1].time_ns, ps[0]))
        path, snap = options[-1]
        kept.append(snap)
        if len(options) > 1:
            names = ", ".join(os.path.basename(p) for p, _ in options)
            notes[rank] = (
                f"{len(options)} dumps ({names}); kept the newest, {os.path.basename(path)}"
            )
    return kept, notes


def from_live(statuses: JobStatuses, world_size: int | None = None) -> Inputs:
    """A live job as fetched by :func:`cclctl.live.snapshot.fetch` (the same as ``top``)."""
    size = statuses.rdzv_world_size if statuses.rdzv_world_size is not None else world_size
    return Inputs(
        snapshots=[statuses.statuses[r] for r in sorted(statuses.statuses)],
        source="live",
        now_ns=statuses.fetched_ns,
        world_size=size,
        unreadable=dict(statuses.bad),
    )
