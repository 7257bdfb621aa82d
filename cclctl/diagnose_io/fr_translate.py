"""From PyTorch Flight Recorder entries to cclctl's records, one rank at a time.

What a Flight Recorder dump holds, and how it maps:

- ``entries``: the ring, oldest first. ``process_group`` is ``(name, desc)``; groups are
  joined across ranks by *name* (torch names them by creation order, the same on every rank),
  never by ``pg_id``, which counts per process. ``collective_seq_id`` is the seq every member
  agrees on; point-to-point entries have their own ``p2p_seq_id``.
- completion: NCCL moves ``state`` to ``completed``; gloo leaves it at ``scheduled`` and only
  sets ``retired``, and ``pg_status[pg_id].last_completed_collective`` (in ``op_id`` terms)
  says how far each group got. Any of the three counts.
- ``pg_config`` names each group's member ranks for NCCL; gloo writes it empty. Members are
  then inferred: the default group (``desc`` "default_pg") is the whole job, any other group
  the ranks whose dumps mention it.

Only what a diagnosis reads is kept: per group the newest :data:`TAIL` calls, the calls
still open, and the highest started and completed seq. A dump of 2,000 entries becomes a
few dozen small records, so 512 ranks fit in a few MB once read.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, TypeGuard

from cclctl import limits
from cclctl.diagnose_io.fr_stacks import Site, site_of
from cclctl.errors import BadInput
from cclctl.records import COMPLETED, STARTED, CollectiveRecord

#: Completed calls kept per group (the engine compares the last 8).
TAIL = 16
#: Calls still open kept per group besides the tail (older async calls never waited on).
OPEN = 64

#: c10 scalar type names as dumps spell them -> (numpy-style name, bytes per element).
DTYPES = {
    "Float": ("float32", 4),
    "Double": ("float64", 8),
    "Half": ("float16", 2),
    "BFloat16": ("bfloat16", 2),
    "Long": ("int64", 8),
    "Int": ("int32", 4),
    "Short": ("int16", 2),
    "Char": ("int8", 1),
    "Byte": ("uint8", 1),
    "Bool": ("bool", 1),
    "ComplexFloat": ("complex64", 8),
    "ComplexDouble": ("complex128", 16),
    "Float8_e4m3fn": ("float8_e4m3fn", 1),
    "Float8_e5m2": ("float8_e5m2", 1),
}

#: profiling names -> the op names cclctl's own records use (bandwidth.COLLECTIVES).
OPS = {
    "allreduce": "all_reduce",
    "allgather": "all_gather",
    "_all_gather_base": "all_gather",
    "all_gather_single": "all_gather",
    "all_gather_into_tensor": "all_gather",
    "_reduce_scatter_base": "reduce_scatter",
    "reduce_scatter_single": "reduce_scatter",
    "reduce_scatter_tensor": "reduce_scatter",
    "_broadcast_oop": "broadcast",
    "_reduce_oop": "reduce",
    "alltoall": "all_to_all",
    "alltoall_base": "all_to_all",
    "all_to_all_single": "all_to_all",
    "all_reduce_barrier": "barrier",
}
_P2P = re.compile(r"^(send|recv)\s+(-?\d+)\s*(->|<-)\s*(-?\d+)$")
_INT = re.compile(r"-?\d+")


@dataclasses.dataclass(slots=True)
class Group:
    """One process group as one rank's dump shows it."""

    name: str
    desc: str
    started: int = 0
    completed: int = 0
    kept: int = 0
    open_kept: int = 0
    records: list[CollectiveRecord] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(slots=True)
class RankDump:
    """What one rank's dump says, condensed (the parsed file itself is not kept)."""

    rank: int
    path: str
    fmt: str
    version: str
    time_ns: int
    entries: int
    groups: dict[str, Group]
    members: dict[str, list[int]]  # from pg_config, when the backend wrote it
    sites: list[Site] = dataclasses.field(default_factory=list)  # newest call, open calls


def _fail(path: str, why: str) -> BadInput:
    return BadInput(f"{path}: {why}", path=path)


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _as_int(value: object, default: int) -> int:
    """An int from a dump field that may be an int or its text (JSON dumps write strings)."""
    if _is_int(value):
        return int(value)
    if isinstance(value, str) and _INT.fullmatch(value.strip()):
        return int(value)
    return default


def _mapping(value: object) -> dict[Any, Any]:
    return value if isinstance(value, dict) else {}


def _ranks(value: object, path: str) -> list[int]:
    """``pg_config`` ranks: the text ``"[0, 1, 2]"`` or a list; never evaluated as code.
    Each is a rank below :data:`cclctl.limits.MAX_WORLD_SIZE` (TooLarge otherwise)."""
    if isinstance(value, str):
        found = [int(x) if len(x) <= 9 else 10**9 for x in _INT.findall(value)]
    elif isinstance(value, list | tuple):
        found = [int(x) for x in value if _is_int(x)]
    else:
        return []
    if found:
        limits.rank(max(found), path, "a process group member")
    return found


#: No tensor has more elements; a product beyond it is a corrupt size, not a count.
_MAX_NUMEL = 1 << 62


def _numel(sizes: object) -> int:
    total = 0
    if isinstance(sizes, list | tuple):
        for shape in sizes:
            if isinstance(shape, list | tuple):
                n = 1
                for dim in shape:
                    n *= dim if _is_int(dim) else 0
                    if not -_MAX_NUMEL <= n <= _MAX_NUMEL:
                        raise ValueError(f"a tensor size of more than {_MAX_NUMEL} elements")
                total += n
    return total


def _op(profiling_name: object) -> tuple[str, int | None]:
    """(op, peer in the group) from ``"gloo:all_reduce"`` or ``"nccl:send 0->3"``."""
    name = str(profiling_name or "")
    name = name.split(":", 1)[1] if ":" in name else name
    match = _P2P.match(name.strip())
    if match is not None:
        kind, a, arrow, b = match.groups()
        # "send s->d" and "recv d<-s": the peer is the far end either way
        return kind, int(b) if (arrow == "->") == (kind == "send") else int(a)
    return OPS.get(name, name), None


def _last_completed(doc: dict[Any, Any]) -> dict[str, int]:
    """pg_id -> the op_id of its last completed collective (``pg_status``), -1 if unknown."""
    return {
        str(pg): _as_int(info.get("last_completed_collective"), -1)
        for pg, info in _mapping(doc.get("pg_status")).items()
        if isinstance(info, dict)
    }


def _members(doc: dict[Any, Any], path: str) -> dict[str, list[int]]:
    """Group name -> its member ranks (``pg_config``; gloo leaves it empty)."""
    members: dict[str, list[int]] = {}
    for key, info in _mapping(doc.get("pg_config")).items():
        if isinstance(info, dict):
            name, ranks = str(info.get("name") or key), _ranks(info.get("ranks"), path)
            if name and ranks:
                members[name] = ranks
    return members


def read_rank(doc: Any, rank: int, path: str, fmt: str, mtime_ns: int) -> RankDump:
    """Condense one parsed dump; BadInput naming the file when its shape is not a dump's."""
    if not isinstance(doc, dict):
        raise _fail(path, "not a Flight Recorder dump (expected a mapping at the top)")
    entries = doc.get("entries", [])
    if not isinstance(entries, list):
        raise _fail(path, "field 'entries' is not a list")
    done_op, members = _last_completed(doc), _members(doc, path)
    groups, open_sites, newest, latest = _scan(entries, done_op, path)
    version = str(doc.get("version", ""))
    time_ns = max(mtime_ns, latest)
    found = [newest] if newest is not None else []
    found += [open_sites[name] for name in sorted(open_sites)]
    return RankDump(rank, path, fmt, version, time_ns, len(entries), groups, members, found)


def _scan(
    entries: list[Any], done_op: dict[str, int], path: str
) -> tuple[dict[str, Group], dict[str, Site], Site | None, int]:
    """Each group's progress and kept records, every group's oldest open call site, the
    newest entry's site and the latest start: (groups, open sites, newest, latest)."""
    groups: dict[str, Group] = {}
    open_sites: dict[str, Site] = {}  # group -> where its oldest open call was made
    newest: Site | None = None
    latest = 0
    last = len(entries) - 1
    # Newest first, and cheap for every entry: only the few kept become records, but the
    # seq maxima and the checks need them all (type() first: isinstance is slower).
    for back, e in enumerate(reversed(entries)):
        if type(e) is not dict and not isinstance(e, dict):
            raise _fail(path, f"entry {last - back} is not a mapping")
        pg = e.get("process_group")
        if (type(pg) is tuple or type(pg) is list) and len(pg) == 2 and type(pg[0]) is str:
            name = pg[0]
        else:
            name = _group_of(e, pg)[0]
        group = groups.get(name)
        if group is None:
            group = groups[name] = Group(*_group_of(e, pg))
        p2p = e.get("is_p2p") is True
        seq = e.get("p2p_seq_id" if p2p else "collective_seq_id")
        if not (type(seq) is int or _is_int(seq)):
            raise _fail(path, f"entry {last - back} has no integer sequence number")
        done = (
            e.get("retired") is True
            or e.get("state") == "completed"
            or _as_int(e.get("op_id"), 1 << 62) <= done_op.get(str(e.get("pg_id")), -1)
        )
        if not p2p:
            if seq > group.started:
                group.started = seq
            if done and seq > group.completed:
                group.completed = seq
        if done:
            if group.kept >= TAIL:
                continue
            group.kept += 1
        elif group.open_kept >= OPEN:
            continue
        else:
            group.open_kept += 1
        rec = _record(e, name, seq, done, p2p)
        if not back or not done:
            site = site_of(e, name, seq, p2p, rec.op)
            if site is not None and not done:
                open_sites[name] = site
            if not back:
                newest = site
        if rec.start_ns > latest:
            latest = rec.start_ns
        group.records.append(rec)
    for group in groups.values():
        group.records.reverse()
    return groups, open_sites, newest, latest


def _group_of(e: dict[str, Any], pg: object) -> tuple[str, str]:
    """(name, desc) of an entry's group: ``process_group`` is (name, desc), else ``pg_id``."""
    if isinstance(pg, list | tuple) and len(pg) == 2:
        return str(pg[0]), str(pg[1])
    return str(e.get("pg_id", "")), ""


def _record(e: dict[str, Any], group: str, seq: int, done: bool, p2p: bool) -> CollectiveRecord:
    op, peer = _op(e.get("profiling_name"))
    dtypes = e.get("input_dtypes") or e.get("output_dtypes")
    first = dtypes[0] if isinstance(dtypes, list | tuple) and dtypes else ""
    dtype, itemsize = DTYPES.get(str(first), (str(first).lower(), 0))
    count = _numel(e.get("input_sizes"))
    full = _numel(e.get("output_sizes")) if op == "all_gather" else count
    start = _as_int(e.get("time_discovered_started_ns"), 0) or _as_int(e.get("time_created_ns"), 0)
    end = _as_int(e.get("time_discovered_completed_ns"), 0) if done else 0
    rec = CollectiveRecord(
        comm=group,
        seq=seq,
        op=op,
        dtype=dtype,
        count=count,
        nbytes=full * itemsize,
        peer=(-1 if peer is None else peer) if p2p else None,
        state=COMPLETED if done else STARTED,
        start_ns=start,
        end_ns=end,
    )
    if not p2p:  # the join with cclctl's own records of a torch job
        rec.pg_name, rec.torch_seq = group, seq
    if p2p and not done and op in ("send", "recv"):
        rec.waiting_on, rec.waiting_for = rec.peer, op
    return rec
