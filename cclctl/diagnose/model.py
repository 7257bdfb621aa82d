"""What a diagnosis says: verdicts (kind, suspects, where, evidence, next step) and options.

These are plain dataclasses so the engine can build them step by step (a later check adds
evidence to an earlier verdict instead of repeating it) and the CLI can print them or turn
them into the versioned ``cclctl.diagnosis`` JSON document. Nothing here carries a time of
its own: the same input always gives the same document, byte for byte.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from cclctl.ranges import fold_ranks
from cclctl.stack_records import ThreadStack

DIAGNOSIS_SCHEMA = "cclctl.diagnosis"
DIAGNOSIS_VERSION = 1

DEAD = "dead"
STOPPED = "stopped"
STALE = "stale"  # no fresh status, and nothing shows the process stopped
MISSING = "missing"
NOT_ENTERED = "not_entered"
MISMATCH = "mismatch"
LINK = "link"
STUCK = "stuck"
ABORTED = "aborted"  # an operator (or an abort policy) aborted the job: nobody is blamed
HEALTHY = "healthy"
KINDS = (DEAD, STOPPED, STALE, MISSING, NOT_ENTERED, MISMATCH, LINK, STUCK, ABORTED, HEALTHY)

#: Report order: the most certain faults first. A missing rank that others wait on is as
#: certain as a dead one; a missing rank nobody waits on is the weakest evidence of all.
_PRIORITY = {
    DEAD: 0,
    STOPPED: 1,
    STALE: 1,
    NOT_ENTERED: 3,
    MISMATCH: 4,
    LINK: 5,
    STUCK: 6,
    ABORTED: 0,
    MISSING: 7,
    HEALTHY: 9,
}
_CORROBORATED_MISSING = 2

#: Evidence lines kept per verdict; the rest are counted, so 4,096 ranks stay readable.
MAX_EVIDENCE = 12
#: Ranks per verdict whose stacks it shows (the first suspects).
MAX_STACKS = 4


@dataclasses.dataclass(frozen=True)
class Options:
    """Thresholds of the diagnosis, in seconds.

    ``stale_after_s``: a heartbeat older than this (live mode) is a stale status (the
    process table, where it can be read, tells stopped or dead apart). ``skew_margin_s`` is
    added to it for ranks on other hosts, whose clocks may disagree with the reader's by a
    few seconds. ``stuck_after_s``: a collective in flight this long (measured on the rank's
    own clock) is hung, not merely running.
    """

    stale_after_s: float = 10.0
    skew_margin_s: float = 5.0
    stuck_after_s: float = 5.0

    def to_dict(self) -> dict[str, float]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True, order=True)
class Suspect:
    """A rank to look at; ``host`` is "" and ``pid`` 0 when no document of it was read."""

    rank: int
    host: str = ""
    pid: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"rank": self.rank, "host": self.host or None, "pid": self.pid or None}

    def where(self) -> str:
        """``"pid 1234 on host-b"``, or what is known of it."""
        if self.pid and self.host:
            return f"pid {self.pid} on {self.host}"
        return f"pid {self.pid}" if self.pid else (f"on {self.host}" if self.host else "")


@dataclasses.dataclass
class Verdict:
    """One finding. ``link`` names the two ranks whose connection is suspect (kind ``link``).

    ``where``: one line per rank whose dump holds a stack ("rank 2 is in train.py:41
    load_batch -> time.sleep"), and ``stacks`` those ranks' whole stacks. ``look_at``: the
    ranks to show them for when the verdict names no suspect.
    """

    kind: str
    summary: str
    suspects: list[Suspect] = dataclasses.field(default_factory=list)
    comm: str | None = None
    seq: int | None = None
    op: str | None = None
    evidence: list[str] = dataclasses.field(default_factory=list)
    next_step: str = ""
    link: tuple[int, int] | None = None
    corroborated: bool = False  # some hung rank waits on a suspect (orders missing ranks)
    fallback: tuple[str, int, str | None] | None = None  # a weaker place, if none is found
    where: list[str] = dataclasses.field(default_factory=list)
    stacks: dict[int, list[ThreadStack]] = dataclasses.field(default_factory=dict)
    look_at: list[int] = dataclasses.field(default_factory=list)
    origin: bool = False  # the origin of the job's revoke record: the verdict, ahead of all
    #: the communicator the survivors run on without the suspects (a shrink left them out):
    #: history, reported after the faults of the communicators that run now
    shrunk_away: str | None = None
    pg_name: str | None = None  # a torch job's process group and its own seq for the call
    torch_seq: int | None = None  # (Flight Recorder's process_group name, collective_seq_id)

    @property
    def fault(self) -> bool:
        return self.kind != HEALTHY

    @property
    def ranks(self) -> str:
        """The suspects folded: ``"2,5-7"``."""
        return fold_ranks(s.rank for s in self.suspects)

    def sort_key(self) -> tuple[bool, bool, int, str, int, int]:
        priority = _PRIORITY[self.kind]
        if self.kind == MISSING and self.corroborated:
            priority = _CORROBORATED_MISSING
        first = self.suspects[0].rank if self.suspects else -1
        past = self.shrunk_away is not None
        return (past, not self.origin, priority, self.comm or "", self.seq or 0, first)

    def add(self, line: str) -> None:
        """Add evidence once (several checks may notice the same thing)."""
        if line not in self.evidence:
            self.evidence.append(line)

    def place(self, comm: str, seq: int, op: str | None) -> None:
        """Say where the verdict bites, unless an earlier check already did."""
        if self.comm is None:
            self.comm, self.seq, self.op = comm, seq, op

    def suggest(self, comm: str, seq: int, op: str | None) -> None:
        """A weaker place (the first suggestion wins), taken only if nothing places it."""
        if self.fallback is None:
            self.fallback = (comm, seq, op)

    def to_dict(self) -> dict[str, Any]:
        evidence = self.evidence[:MAX_EVIDENCE]
        if len(self.evidence) > MAX_EVIDENCE:
            evidence.append(f"... and {len(self.evidence) - MAX_EVIDENCE} more")
        doc = {
            "kind": self.kind,
            "summary": self.summary,
            "suspects": self.ranks,
            "suspect_ranks": [s.to_dict() for s in self.suspects],
            "link": list(self.link) if self.link else None,
            "comm": self.comm,
            "seq": self.seq,
            "op": self.op,
            "evidence": evidence,
            "next_step": self.next_step,
            "where": list(self.where),
            "stacks": {
                str(rank): [s.to_dict() for s in stacks] for rank, stacks in self.stacks.items()
            },
            "origin": self.origin,
            "shrunk_away": self.shrunk_away,
        }
        if self.torch_seq is not None:  # a torch job's call: the join with Flight Recorder
            doc.update(pg_name=self.pg_name, torch_seq=self.torch_seq)
        return doc


@dataclasses.dataclass(frozen=True)
class CommSummary:
    """One communicator at a glance: how far its members got and whether it is hung."""

    comm: str
    members: list[int]
    started: tuple[int, int]  # lowest and highest last started seq among members seen
    completed: tuple[int, int]
    in_flight: int  # members inside a collective of this communicator
    hung_seq: int | None  # the highest seq some member has waited in past the threshold
    shrunk_to: str | None = None  # the communicator a shrink replaced it with

    @property
    def state(self) -> str:
        if self.shrunk_to is not None:
            return "shrunk"
        if self.hung_seq is not None:
            return "hung"
        return "running" if self.in_flight else "idle"

    def to_dict(self) -> dict[str, Any]:
        return {
            "comm": self.comm,
            "members": fold_ranks(self.members),
            "size": len(self.members),
            "state": self.state,
            "hung_seq": self.hung_seq,
            "shrunk_to": self.shrunk_to,
            "last_started": {"min": self.started[0], "max": self.started[1]},
            "last_completed": {"min": self.completed[0], "max": self.completed[1]},
            "in_flight": self.in_flight,
        }


@dataclasses.dataclass(frozen=True)
class Diagnosis:
    """The whole answer: verdicts (faults first; one ``healthy`` verdict when none)."""

    job: str
    source: str  # "dumps" or "live"
    world_size: int
    ranks_seen: int
    verdicts: list[Verdict]
    comms: list[CommSummary]
    notes: list[str]
    options: Options

    @property
    def fault(self) -> bool:
        return any(v.fault for v in self.verdicts)

    @property
    def faults(self) -> list[Verdict]:
        return [v for v in self.verdicts if v.fault]

    def to_dict(self) -> dict[str, Any]:
        """The ``cclctl.diagnosis`` document, version 1: add fields freely; renaming or
        removing one needs a new version.
        """
        return {
            "schema": DIAGNOSIS_SCHEMA,
            "version": DIAGNOSIS_VERSION,
            "job": self.job,
            "source": self.source,
            "world_size": self.world_size,
            "ranks_seen": self.ranks_seen,
            "fault": self.fault,
            "verdicts": [v.to_dict() for v in self.verdicts],
            "comms": [c.to_dict() for c in self.comms],
            "notes": list(self.notes),
            "options": self.options.to_dict(),
        }
