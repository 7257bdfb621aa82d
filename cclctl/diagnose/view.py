"""The engine's working view of a job: one :class:`RankState` per rank, one :class:`CommView`
per communicator, built once from the snapshots so that every check is a linear pass.

Ordering never uses wall-clock start times across ranks (hosts' clocks disagree): positions
are sequence numbers, and a collective's age is measured on the clock of the rank that is in
it (its snapshot's ``time_ns`` minus the record's ``start_ns``).
"""

from __future__ import annotations

import dataclasses

from cclctl.diagnose.model import Options, Suspect
from cclctl.endings import ENDING_TERMINATED, ENDING_UNCAUGHT, ENDING_WORDS
from cclctl.host_status import PROC_GONE, PROC_RUNNING, PROC_STOPPED, PROC_ZOMBIE
from cclctl.records import (
    ABORTED,
    COMPLETED,
    FAILED,
    STARTED,
    TIMED_OUT,
    CollectiveRecord,
    CommInfo,
    RankSnapshot,
)
from cclctl.revocation import Revocation
from cclctl.stack_records import ThreadStack

#: Collective records kept per rank and communicator: enough to compare the last few calls.
TAIL = 8
#: The reason in the last status of a rank that closed cleanly (see telemetry.hub.snapshot).
CLOSED = "closed"
#: How the reason of a rank's last document starts when it says how it ended other than
#: cleanly (``Telemetry.exit_reason``): it was stopped, or an exception ended it. Readers
#: go by the document's ``ending`` field; these words are what the reason then says.
TERMINATED, UNCAUGHT = ENDING_WORDS[ENDING_TERMINATED], ENDING_WORDS[ENDING_UNCAUGHT]
_NS = 1e9

#: A rank's process as the command saw it on this host, or the rank's host agent on its own
#: (None: not looked at). The words are the host documents' (:mod:`cclctl.host_status`).
PROC_STATES = (PROC_RUNNING, PROC_STOPPED, PROC_ZOMBIE, PROC_GONE)


def in_flight(rec: CollectiveRecord) -> bool:
    """Still inside the call: started (or marked timed out by the watchdog) and not ended."""
    return rec.state in (STARTED, TIMED_OUT) and not rec.end_ns


@dataclasses.dataclass(slots=True)
class RankState:
    """What the checks need of one rank (the newest of its documents). ``live``: it comes
    from a live status; ``proc``: its process state on this host (see :data:`PROC_STATES`).
    """

    rank: int
    host: str
    pid: int
    time_ns: int
    comms: dict[str, CommInfo]
    tail: dict[str, dict[int, CollectiveRecord]]  # comm -> seq -> collective record
    inflight: list[CollectiveRecord]  # collective and point-to-point, oldest first
    closed: bool = False  # its last document says it closed cleanly (it finished, not died)
    stacks: list[ThreadStack] = dataclasses.field(default_factory=list)
    revoke: Revocation | None = None  # the job's failure as this rank adopted it
    live: bool = False
    proc: str | None = None
    #: how its last document says it ended, other than cleanly ("terminated by SIGTERM",
    #: "uncaught RuntimeError: ..."); "" when it does not say
    ended: str = ""

    @property
    def suspect(self) -> Suspect:
        return Suspect(self.rank, self.host, self.pid)

    def last(self, comm: str) -> CollectiveRecord | None:
        calls = self.tail.get(comm)
        return calls[max(calls)] if calls else None

    def started(self, comm: str) -> int:
        info = self.comms.get(comm)
        calls = self.tail.get(comm)
        return max(info.last_started if info else 0, max(calls) if calls else 0)

    def progress(self, comm: str) -> tuple[int, int, CollectiveRecord | None]:
        """The last seq it started and the last it completed on ``comm``, and its newest
        record there (None without one), in one look at its tail."""
        info, calls = self.comms.get(comm), self.tail.get(comm)
        started, done = (info.last_started, info.last_completed) if info else (0, 0)
        if not calls:
            return started, done, None
        newest = max(calls)
        for seq, rec in calls.items():
            if rec.state == COMPLETED and seq > done:
                done = seq
        return max(started, newest), done, calls[newest]

    def age_s(self, rec: CollectiveRecord) -> float:
        """How long ``rec`` had run when this rank's document was written (its own clock)."""
        if not rec.start_ns:
            return 0.0
        end = rec.end_ns or self.time_ns
        return max(0.0, (end - rec.start_ns) / _NS)


def rank_state(snap: RankSnapshot) -> RankState:
    """Index a snapshot: the last :data:`TAIL` collective calls per communicator, and what is
    in flight. A retried call (same seq, later epoch) replaces the earlier attempt.
    """
    tail: dict[str, dict[int, CollectiveRecord]] = {}
    records = snap.records  # they hold the call in flight too: a copy of it, once read back
    call = snap.inflight
    if call is not None and not any(r is call or _same_attempt(r, call) for r in records):
        records = [*records, call]
    inflight: list[CollectiveRecord] = []
    for rec in records:
        if in_flight(rec) and not any(_same_call(rec, r) for r in inflight):
            inflight.append(rec)
        if rec.peer is not None:
            continue  # point-to-point seqs count per pair, not per communicator
        calls = tail.get(rec.comm)
        if calls is None:
            calls = tail[rec.comm] = {}
        old = calls.get(rec.seq)
        if old is None or _attempt_key(rec) >= _attempt_key(old):
            calls[rec.seq] = rec
    for comm, calls in tail.items():
        if len(calls) > TAIL:
            keep = sorted(calls)[-TAIL:]
            tail[comm] = {seq: calls[seq] for seq in keep}
    if len(inflight) > 1:
        inflight.sort(key=lambda r: (r.start_ns, r.comm, r.seq))
    closed = snap.finished or snap.reason == CLOSED
    ended = snap.reason if snap.ending else ""
    return RankState(
        snap.rank,
        snap.host,
        snap.pid,
        snap.time_ns,
        snap.comms,
        tail,
        inflight,
        closed,
        snap.stacks,
        snap.revoke,
        ended=ended,
    )


def _attempt_key(rec: CollectiveRecord) -> tuple[int, int, int]:
    """Orders the attempts of one seq: a retry runs in a later epoch, as a later attempt."""
    return rec.epoch, rec.attempt, rec.start_ns


def superseded(rec: CollectiveRecord, done: dict[int, CollectiveRecord]) -> bool:
    """``rec`` ended unfinished in an epoch older than one in which another rank completed
    the same seq (``done``: seq -> the newest completed attempt seen): this rank re-ran it
    too (nobody re-runs alone), so its document only predates the re-run; no hang."""
    newer = done.get(rec.seq)
    return newer is not None and rec.epoch < newer.epoch and not in_flight(rec)


def _same_attempt(a: CollectiveRecord, b: CollectiveRecord) -> bool:
    """One attempt of one call, whatever its progress (two copies of it read from JSON)."""
    return _same_call(a, b) and (a.attempt, a.start_ns) == (b.attempt, b.start_ns)


def _same_call(a: CollectiveRecord, b: CollectiveRecord) -> bool:
    return (a.comm, a.seq, a.peer, a.epoch) == (b.comm, b.seq, b.peer, b.epoch)


def is_hung(state: RankState, rec: CollectiveRecord, opts: Options) -> bool:
    """The call timed out, failed, or has been in flight past ``stuck_after_s``."""
    if rec.state in (TIMED_OUT, FAILED, ABORTED):
        return True
    return in_flight(rec) and state.age_s(rec) >= opts.stuck_after_s


@dataclasses.dataclass(slots=True)
class CommView:
    """One communicator across the ranks that were read.

    ``inside``: members in flight in a call of it. ``open``: members whose last call on it
    did not complete (in flight, or ended in failure), with that record. ``hung``: seqs some
    member has waited in past the threshold (or that timed out or failed), ascending.
    ``doomed``: a member is dead, stopped, stale or missing, so every open call is stuck already,
    however young: checks may tie that member to them (but name nobody new on that alone).
    """

    comm: str
    members: list[int]
    member_set: set[int]
    position: dict[int, int]  # rank -> last started seq
    completed: dict[int, int]
    open: dict[int, CollectiveRecord]
    inside: set[int]
    hung: list[int]
    ops: dict[int, str]  # seq -> op, as the lowest rank with a record of it says
    doomed: bool = False

    def watched(self) -> list[int]:
        """Seqs worth following: the hung ones, and every open one when the comm is doomed."""
        if not self.doomed:
            return self.hung
        return sorted(set(self.hung) | {rec.seq for rec in self.open.values()})

    def failed(self, rank: int) -> bool:
        """Its last call on this communicator ended without completing (an error)."""
        rec = self.open.get(rank)
        return rec is not None and not in_flight(rec)

    def resolve(self, peer: int) -> int:
        """``waiting_on`` as a global rank. cclctl and its torch integration write one; a
        value that cannot be (an index into the members, as documents of older versions
        held for a sub-group or a shrunk communicator) is mapped through them.
        """
        if peer in self.member_set or not 0 <= peer < len(self.members):
            return peer
        return self.members[peer]

    def waiters(self, seq: int) -> list[int]:
        return [r for r, rec in self.open.items() if rec.seq == seq]

    def longest_wait_s(self, states: dict[int, RankState], seq: int) -> float:
        return max((states[r].age_s(self.open[r]) for r in self.waiters(seq)), default=0.0)


def comm_views(
    states: dict[int, RankState], opts: Options, doomed: set[int] | None = None
) -> list[CommView]:
    """Every communicator some rank knows of, sorted by id; members come from the lowest rank
    that lists them (plus any rank that claims the communicator), so the cost stays linear.
    ``doomed``: ranks that cannot take part any more (dead, stopped, stale, missing).
    """
    names: set[str] = set()
    for st in states.values():
        names.update(st.comms)
        names.update(st.tail)
    views = [_comm_view(name, states, opts) for name in sorted(names)]
    for cv in views:
        cv.doomed = bool(doomed) and not cv.member_set.isdisjoint(doomed or ())
    return views


def _comm_view(comm: str, states: dict[int, RankState], opts: Options) -> CommView:
    member_set: set[int] = set()
    for rank in sorted(states):
        info = states[rank].comms.get(comm)
        if info is not None:
            member_set = set(info.ranks)
            break
    member_set.update(r for r, st in states.items() if comm in st.comms or comm in st.tail)
    position: dict[int, int] = {}
    completed: dict[int, int] = {}
    open_: dict[int, CollectiveRecord] = {}
    inside: set[int] = set()
    hung: set[int] = set()
    ops: dict[int, str] = {}
    newest = _completed_attempts(comm, states, member_set)
    for rank in sorted(member_set):
        st = states.get(rank)
        if st is None:
            continue
        started, done, last = st.progress(comm)
        position[rank], completed[rank] = started, done
        calls = st.tail.get(comm)
        if calls and not ops.keys() >= calls.keys():  # a seq no lower rank has a record of
            for seq, rec in calls.items():
                ops.setdefault(seq, rec.op)
        if last is not None and last.state != COMPLETED and superseded(last, newest):
            inside.add(rank)  # re-running the seq the others completed in a later epoch
        elif last is not None and last.seq == started and last.state != COMPLETED:
            open_[rank] = last
            if in_flight(last):
                inside.add(rank)
            if is_hung(st, last, opts):
                hung.add(last.seq)
        elif started > done:
            inside.add(rank)  # entered, not finished, but its record was not kept
    members = sorted(member_set)
    return CommView(
        comm, members, member_set, position, completed, open_, inside, sorted(hung), ops
    )


def _completed_attempts(
    comm: str, states: dict[int, RankState], members: set[int]
) -> dict[int, CollectiveRecord]:
    """Seq -> the completed record of the latest epoch any member shows for it (on ``comm``)."""
    done: dict[int, CollectiveRecord] = {}
    for rank in members:
        st = states.get(rank)
        for seq, rec in (st.tail.get(comm, {}) if st is not None else {}).items():
            if rec.state == COMPLETED and (seq not in done or rec.epoch > done[seq].epoch):
                done[seq] = rec
    return done
