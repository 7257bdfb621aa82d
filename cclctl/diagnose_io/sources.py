"""Read every dump among the paths, of both kinds, and make one job of them.

A folder (or a list of files) may hold cclctl's dumps and PyTorch Flight Recorder dumps side
by side: ``cclctl run`` with ``CCLCTL_TRACE_DIR`` and PyTorch's dump folder in one place. A
Flight Recorder dump names no job, so a folder is taken as one job, the one cclctl's dumps
name (or ``--job``). They merge by rank: where a rank has both, cclctl's dump is its
document (its host, pid, records and every thread's stack) and the Flight Recorder's call
site of its last collective joins its stacks; a rank with only a Flight Recorder dump is
read from that alone. Records of the two kinds are never mixed within a rank, since their
sequence numbers may count differently (cclctl does not see collectives issued from C++).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

from cclctl.diagnose.text import ranks_word
from cclctl.diagnose_io.flight_recorder import find_dumps, read_flight_recorder  # no torch import
from cclctl.diagnose_io.inputs import Inputs, dump_paths, load_dumps
from cclctl.records import RankSnapshot


def count_files(paths: Sequence[str]) -> int:
    """How many cclctl dump files the paths hold (for a progress bar)."""
    theirs = _flight_recorder(paths)
    return len(dump_paths(paths, _elsewhere(theirs)))


def load(
    paths: Sequence[str], job: str | None = None, progress: Callable[[int], None] | None = None
) -> Inputs:
    """Both kinds of dump among ``paths`` as one job's :class:`Inputs` (see module doc)."""
    theirs = _flight_recorder(paths)
    ours = dump_paths(paths, _elsewhere(theirs))
    if not theirs:
        return load_dumps(ours, job, progress)
    if not ours:
        snaps = read_flight_recorder(theirs, job)
        return Inputs(snaps, "dumps", files=len(snaps))
    mine = load_dumps(ours, job, progress)
    return _merge(mine, read_flight_recorder(theirs, mine.snapshots[0].job), len(theirs))


def _flight_recorder(paths: Sequence[str]) -> list[tuple[str, str]]:
    return find_dumps(paths) or []


def _elsewhere(theirs: Sequence[tuple[str, str]]) -> set[str]:
    files = {os.path.normpath(p) for p, _ in theirs}
    return files | {os.path.dirname(p) for p in files}


def _merge(mine: Inputs, theirs: list[RankSnapshot], files: int) -> Inputs:
    by_rank = {snap.rank: snap for snap in mine.snapshots}
    snapshots = list(mine.snapshots)
    both: list[int] = []
    alone: list[int] = []
    for snap in theirs:
        ours = by_rank.get(snap.rank)
        if ours is None:
            snapshots.append(snap)
            alone.append(snap.rank)
        else:
            ours.stacks = [*ours.stacks, *snap.stacks]
            both.append(snap.rank)
    snapshots.sort(key=lambda s: s.rank)
    job = mine.snapshots[0].job
    remarks = [
        f"read {len(mine.snapshots)} cclctl and {len(theirs)} Flight Recorder dumps as job {job!r}"
    ]
    if both:
        remarks.append(
            f"{ranks_word(both)}: cclctl's dump gives the records, the Flight Recorder dump "
            "the call site of the last collective (in the stacks)"
        )
    notes = dict(mine.notes)
    for rank in alone:
        notes[rank] = "only a Flight Recorder dump (no host or pid known)"
    return Inputs(
        snapshots, "dumps", notes=notes, files=mine.files + files, remarks=remarks + mine.remarks
    )
