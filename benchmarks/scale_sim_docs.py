"""Status documents of simulated ranks for ``scale_sim.py``, built in time linear in the ranks.

A status names its world communicator's members folded (``"0-99999"``), so one document is
as long at 100,000 ranks as at 8. Each kind of rank (one that waits in the hung collective,
the one that never entered it, a rank of a job that runs, its straggler; and per position
on its host, so entry-time jitter differs) gets one JSON template, built once through
:class:`cclctl.records.RankSnapshot` with sentinel numbers, then turned into a ``%``-format
string: a rank's document is one ``template % values`` (its rank, host, pid, peers and the
heartbeat's time), never a new snapshot.

The hang is what statuses show when rank ``behind`` never enters seq ``SEQ`` of the world
communicator: it has started and completed ``SEQ - 1``; every other rank started ``SEQ``
(in flight for 30 s, so past ``--stuck-after``) and waits on its ring predecessor, so the
chains of "waiting on" end at ``behind``.

The slow job's signals (:mod:`cclctl.slow_signals`): ``WINDOWS`` complete windows of
``WINDOW_S`` seconds ending before the simulation started, ``CALLS`` calls of the world
communicator per window (all sampled), a ring of peers (``r - 1 -> r -> r + 1``). Rank
``slow`` enters every call ``LAG_SHARE`` of a period late, so it spends ``COMM_SHARE`` of a
window inside calls while the others spend ``COMM_SHARE + LAG_SHARE`` (they wait for it),
and its ring successor records that wait as ``entry_wait_ns`` on it.
"""

from __future__ import annotations

import re
import time
from typing import Any

from cclctl.records import CollectiveRecord, CommInfo, RankSnapshot
from cclctl.slow_signals import CommWindow, PeerWindow, Signals, Window

NS = 1_000_000_000
SEQ = 5000  # the hung collective's seq on the world communicator
NBYTES = 1 << 20

WINDOW_S = 5.0
WINDOWS = 3
CALLS = 24
COMM_SHARE = 0.10
LAG_SHARE = 0.30

# Sentinels: numbers no real field holds, replaced by %-fields in the template.
_RANK, _PID, _TIME, _PREV, _NEXT = 987654301, 987654302, 987654303, 987654304, 987654305
_HOST = "SIMHOST987654306"
_FIELDS = {
    str(_RANK): "%(rank)d",
    str(_PID): "%(pid)d",
    str(_TIME): "%(time)d",
    str(_PREV): "%(prev)d",
    str(_NEXT): "%(next)d",
    _HOST: "%(host)s",
}
_SENTINEL = re.compile("|".join(map(re.escape, _FIELDS)))


def _template(snap: RankSnapshot) -> str:
    text = snap.to_json().replace("%", "%%")
    return _SENTINEL.sub(lambda m: _FIELDS[m.group(0)], text)


def _status(job: str, n: int, **fields: Any) -> str:
    """A status template of job ``job`` of ``n`` ranks: the rank's own numbers (rank, pid,
    host, time) as %-fields, ``fields`` as given."""
    return _template(
        RankSnapshot(kind="status", job=job, rank=_RANK, world_size=n, host=_HOST, pid=_PID,
                     time_ns=_TIME, **fields)
    )  # fmt: skip


def world(n: int) -> str:
    return f"0:0-{n - 1}"


def hang_templates(job: str, n: int, t0_ns: int) -> dict[str, str]:
    """``waiting`` (a rank in the hung call) and ``behind`` (the one that never entered)."""
    comm = world(n)
    members = list(range(n))  # folded once per template: O(n) per kind, never per rank
    out = {}
    for kind in ("waiting", "behind"):
        behind = kind == "behind"
        inflight = None
        if not behind:
            inflight = CollectiveRecord(
                comm, SEQ, "all_reduce", "float32", NBYTES // 4, NBYTES, algo="ring",
                start_ns=t0_ns - 30 * NS, waiting_on=_PREV, waiting_for="recv",
            )  # fmt: skip
        done = SEQ - 1
        out[kind] = _status(
            job,
            n,
            comms={comm: CommInfo(members, done if behind else SEQ, done)},
            records=[inflight] if inflight else [],
            inflight=inflight,
            counters={"collectives": done, "errors": 0, "retries": 0, "hangs": 0},
        )
    return out


def slow_templates(job: str, n: int, t0_ns: int, per_host: int) -> dict[str, str]:
    """Per position on a host (``normal0``..): a rank of a job that runs; ``slow``: its
    straggler; ``after``: the straggler's ring successor (it waits on the straggler)."""
    comm = world(n)
    members = list(range(n))  # folded once per template: O(n) per kind, never per rank
    end = int(t0_ns // NS // WINDOW_S * WINDOW_S) * NS
    starts = [end - (WINDOWS - i) * int(WINDOW_S * NS) for i in range(WINDOWS)]
    out = {}
    kinds = [(f"normal{p}", p) for p in range(per_host)] + [("slow", 0), ("after", 1)]
    for kind, position in kinds:
        out[kind] = _status(
            job,
            n,
            comms={comm: CommInfo(members, 10_000, 10_000)},
            counters={"collectives": 10_000, "errors": 0, "retries": 0, "hangs": 0},
            signals=_signals(comm, starts, kind, position),
        )
    return out


def _signals(comm: str, starts: list[int], kind: str, position: int) -> Signals:
    window_ns = int(WINDOW_S * NS)
    period_ns = window_ns // CALLS
    late = kind == "slow"
    jitter_ns = 50_000 * position  # 0.05 ms per position: the ranks do not tie
    share = COMM_SHARE + (0.0 if late else LAG_SHARE) + 0.002 * position
    lateness = int(CALLS * LAG_SHARE * period_ns)
    windows = []
    for index, start in enumerate(starts):
        entries = []
        for k in range(CALLS):
            enter = start + k * period_ns + jitter_ns + (int(LAG_SHARE * period_ns) if late else 0)
            entries.append((index * CALLS + k + 1, enter))
        data = CALLS * NBYTES
        wait = int(data / 1e9 * NS)
        peers = {
            _PREV: PeerWindow("tcp", received=data, recv_wait_ns=wait,
                              entry_wait_ns=lateness if kind == "after" else 0),
            _NEXT: PeerWindow("tcp", sent=data, send_wait_ns=wait // 3),
        }  # fmt: skip
        cw = CommWindow(CALLS, int(share * window_ns), entries)
        windows.append(Window(start, start + window_ns, {comm: cw}, peers))
    return Signals(window_s=WINDOW_S, windows=windows)


def values(rank: int, n: int, per_host: int, pid_base: int, now_ns: int) -> dict[str, Any]:
    return {
        "rank": rank,
        "pid": pid_base + rank,
        "host": host_name(rank // per_host),
        "time": now_ns,
        "prev": (rank - 1) % n,
        "next": (rank + 1) % n,
    }


def host_name(index: int) -> str:
    return f"simnode{index:05d}"


def now_ns() -> int:
    return time.time_ns()
