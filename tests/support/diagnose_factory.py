"""Record factories: build a job of N ranks at chosen seqs and states, as dumps or statuses.

A :class:`Job` starts with every rank having completed ``done`` calls on the world
communicator; tests then move some ranks into a call (in flight, waiting on a peer), add
sub-group communicators, skew hosts' clocks, have ranks adopt a revoke record
(:func:`revocation`) or finish cleanly, and take the snapshots the engine reads.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from typing import Any

from cclctl.records import COMPLETED, STARTED, TIMED_OUT, CollectiveRecord, CommInfo, RankSnapshot
from cclctl.revocation import Revocation
from cclctl.stack_records import Frame, ThreadStack

T0 = 1_700_000_000_000_000_000  # the reader's clock when it fetched (live mode)
NS = 1_000_000_000
RANKS_PER_HOST = 4


def world(n: int) -> str:
    return f"0:0-{n - 1}" if n > 1 else "0:0"


def host_of(rank: int) -> str:
    return f"host-{rank // RANKS_PER_HOST}"


def pid_of(rank: int) -> int:
    return 1000 + rank


@dataclasses.dataclass
class _Rank:
    comms: dict[str, CommInfo] = dataclasses.field(default_factory=dict)
    records: list[CollectiveRecord] = dataclasses.field(default_factory=list)
    age_s: float = 0.2  # how old its document is, as of T0 (on its own clock)
    stacks: list[ThreadStack] = dataclasses.field(default_factory=list)
    revoke: Revocation | None = None
    finished: bool = False


def revocation(kind: str, origin: int, reason: str = "", **fields: Any) -> Revocation:
    """A revoke record as the runtime writes one: the origin's host and pid as the factory
    names them, in all_reduce seq 11 of a 4-rank world, seen by rank 0, at ``T0``."""
    defaults: dict[str, Any] = {
        "host": host_of(origin) if origin >= 0 else "",
        "pid": pid_of(origin) if origin >= 0 else 0,
        "comm": world(4),
        "seq": 11,
        "op": "all_reduce",
        "seen_by": 0,
        "via": "link",
        "time_ns": T0,
    }
    return Revocation(kind, origin, reason, **(defaults | fields))


class Job:
    """A job of ``n`` ranks that all completed seqs 1..``done`` of the world communicator."""

    def __init__(self, n: int, done: int = 10, *, job: str = "j1", op: str = "all_reduce") -> None:
        self.n = n
        self.job = job
        self.world = world(n)
        self.ranks = {r: _Rank() for r in range(n)}
        self.skew_s: dict[str, float] = {}
        self.t0 = T0  # the reader's clock; tests with real processes set it to now
        self.hosts: dict[int, str] = {}  # overrides of host_of()
        self.pids: dict[int, int] = {}  # overrides of pid_of()
        self.add_comm(self.world, range(n), done, op=op)

    def add_comm(
        self, comm: str, members: Iterable[int], done: int = 0, *, op: str = "all_reduce"
    ) -> Job:
        """Declare a communicator; its members completed seqs 1..``done`` (the last 3 kept)."""
        ranks = sorted(members)
        for r in ranks:
            self.ranks[r].comms[comm] = CommInfo(ranks, done, done)
            for seq in range(max(1, done - 2), done + 1):
                self.ranks[r].records.append(self._record(r, comm, seq, op, COMPLETED, 60.0))
        return self

    def complete(self, ranks: Iterable[int], upto: int, comm: str | None = None) -> Job:
        """Move ``ranks`` forward: they completed everything up to ``upto``."""
        comm = comm or self.world
        for r in ranks:
            info = self.ranks[r].comms[comm]
            for seq in range(info.last_completed + 1, upto + 1):
                self.ranks[r].records.append(self._record(r, comm, seq, "all_reduce", COMPLETED, 1))
            info.last_started = info.last_completed = upto
        return self

    def enter(
        self,
        ranks: Iterable[int],
        seq: int | None = None,
        *,
        comm: str | None = None,
        op: str = "all_reduce",
        age_s: float = 30.0,
        waiting_on: Callable[[int], int | None] | dict[int, int] | None = None,
        waiting_for: str = "recv",
        state: str = STARTED,
        **fields: Any,
    ) -> Job:
        """``ranks`` are inside ``seq`` (default: the next one) for ``age_s`` seconds."""
        comm = comm or self.world
        for r in ranks:
            info = self.ranks[r].comms[comm]
            at = info.last_completed + 1 if seq is None else seq
            rec = self._record(r, comm, at, op, state, age_s, **fields)
            peer = waiting_on(r) if callable(waiting_on) else (waiting_on or {}).get(r)
            if peer is not None:
                rec.waiting_on, rec.waiting_for = peer, waiting_for
            self.ranks[r].records.append(rec)
            info.last_started = max(info.last_started, at)
        return self

    def stack(self, rank: int, *frames: tuple[str, int, str, str], main: bool = True) -> Job:
        """Give ``rank``'s dump a thread stack: (file, line, function, code), outermost first."""
        name = "MainThread" if main else "worker"
        stack = ThreadStack(name, tuple(Frame(*f) for f in frames), main, ident=1 + rank)
        self.ranks[rank].stacks.append(stack)
        return self

    def revoke(self, ranks: Iterable[int], record: Revocation) -> Job:
        """``ranks`` adopted ``record`` (their documents carry it)."""
        for r in ranks:
            self.ranks[r].revoke = record
        return self

    def finish(self, ranks: Iterable[int]) -> Job:
        """``ranks`` closed their communicators and exited cleanly (``finished`` documents)."""
        for r in ranks:
            self.ranks[r].finished = True
        return self

    def stale(self, ranks: Iterable[int], age_s: float) -> Job:
        """Their last document is ``age_s`` old (a rank that stopped publishing)."""
        for r in ranks:
            self.ranks[r].age_s = age_s
        return self

    def _record(
        self, rank: int, comm: str, seq: int, op: str, state: str, age_s: float, **fields: Any
    ) -> CollectiveRecord:
        defaults: dict[str, Any] = {"dtype": "float32", "count": 1024, "nbytes": 4096}
        rec = CollectiveRecord(comm, seq, op, state=state, **(defaults | {"algo": "ring"} | fields))
        rec.start_ns = -int(age_s * NS)  # relative to the document's time; fixed in snapshot()
        if state == COMPLETED:
            rec.end_ns = rec.start_ns + 50_000
        return rec

    def snapshot(self, rank: int, kind: str = "dump") -> RankSnapshot:
        """Rank ``rank``'s document: time on its host's (possibly skewed) clock."""
        info = self.ranks[rank]
        host = self.hosts.get(rank, host_of(rank))
        clock = self.t0 + int(self.skew_s.get(host, 0.0) * NS)
        time_ns = clock - int(info.age_s * NS)
        records = []
        for rec in info.records:
            copy = dataclasses.replace(rec, start_ns=time_ns + rec.start_ns)
            if rec.end_ns:
                copy.end_ns = time_ns + rec.end_ns
            records.append(copy)
        inflight = [r for r in records if r.state in (STARTED, TIMED_OUT) and not r.end_ns]
        if kind == "status":  # as the hub publishes: each comm's last finished call + in flight
            last: dict[str, CollectiveRecord] = {}
            for rec in records:
                if rec not in inflight and rec.seq >= getattr(last.get(rec.comm), "seq", 0):
                    last[rec.comm] = rec
            records = sorted([*last.values(), *inflight], key=lambda r: (r.start_ns, r.seq))
        return RankSnapshot(
            kind=kind,
            job=self.job,
            rank=rank,
            world_size=self.n,
            host=host,
            pid=self.pids.get(rank, pid_of(rank)),
            time_ns=time_ns,
            comms={k: dataclasses.replace(v) for k, v in info.comms.items()},  # lists shared
            records=records,
            inflight=inflight[0] if inflight else None,
            reason="test",
            stacks=list(info.stacks) if kind == "dump" else [],
            revoke=info.revoke,
            finished=info.finished,
        )

    def snapshots(self, kind: str = "dump", without: Iterable[int] = ()) -> list[RankSnapshot]:
        skip = set(without)
        return [self.snapshot(r, kind) for r in range(self.n) if r not in skip]


def ring_left(n: int) -> Callable[[int], int]:
    """In a ring every rank receives from its left neighbour."""
    return lambda r: (r - 1) % n
