"""Condensed Flight Recorder dumps of a job's ranks, joined into cclctl's rank snapshots.

Group members and communicator ids are agreed across all dumps (``pg_config`` where a dump
has it, else the default group is the whole job and any other group the ranks whose dumps
mention it), and peers, named in dumps by their index in the group, become global ranks.
"""

from __future__ import annotations

from collections.abc import Sequence

from cclctl import limits
from cclctl.diagnose_io.fr_stacks import call_site
from cclctl.diagnose_io.fr_translate import RankDump
from cclctl.ranges import fold_ranks
from cclctl.records import STARTED, CollectiveRecord, CommInfo, RankSnapshot


def snapshots(
    dumps: Sequence[RankDump], job: str, world_size: int | None = None
) -> list[RankSnapshot]:
    """Every rank's snapshot, with group members and comm ids agreed across all dumps, so the
    result is the same whatever order the files came in.
    """
    dumps = sorted(dumps, key=lambda d: (d.rank, d.path))
    highest = max((r for d in dumps for ranks in d.members.values() for r in ranks), default=-1)
    size = world_size or max(highest, max(d.rank for d in dumps)) + 1
    limits.world_size(size, "the Flight Recorder dumps")  # members and ranks were checked
    members: dict[str, list[int]] = {}
    for d in dumps:  # pg_config first: the lowest rank that lists a group decides
        for name, ranks in d.members.items():
            members.setdefault(name, sorted(set(ranks)))
    seen: dict[str, list[int]] = {}
    everyone = list(range(size))  # one list for every default group (readers never modify)
    for d in dumps:  # in rank order, so each list is sorted
        for name, group in d.groups.items():
            seen.setdefault(name, []).append(d.rank)
            if name not in members and group.desc == "default_pg":
                members[name] = everyone
    for name, ranks in seen.items():
        members.setdefault(name, sorted(set(ranks)))
    ids = {name: f"{name}:{fold_ranks(ranks)}" for name, ranks in members.items()}
    return [_snapshot(d, job, size, members, ids) for d in dumps]


def _snapshot(
    d: RankDump, job: str, size: int, members: dict[str, list[int]], ids: dict[str, str]
) -> RankSnapshot:
    comms: dict[str, CommInfo] = {}
    records: list[CollectiveRecord] = []
    for name, group in d.groups.items():
        comm, ranks = ids[name], members[name]
        comms[comm] = CommInfo(ranks, group.started, group.completed)
        for rec in group.records:
            rec.comm = comm
            if rec.peer is not None and 0 <= rec.peer < len(ranks):
                rec.peer = ranks[rec.peer]  # dumps name peers by their index in the group
                if rec.waiting_on is not None:
                    rec.waiting_on = rec.peer
        records += group.records
    records.sort(key=lambda r: (r.start_ns, r.comm, r.seq))
    inflight = [r for r in records if r.state == STARTED]
    stacks = call_site(d.sites, inflight[0] if inflight else None, ids)
    return RankSnapshot(
        kind="dump",
        job=job,
        rank=d.rank,
        world_size=size,
        host="",
        pid=0,
        time_ns=d.time_ns,
        comms=comms,
        records=records,
        inflight=inflight[0] if inflight else None,
        reason=f"PyTorch Flight Recorder dump ({d.fmt}, version {d.version}, {d.entries} entries)",
        stacks=stacks,
    )
