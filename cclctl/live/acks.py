"""Who acknowledged a revoke record, and why the others did not: pure, from one listing.

After ``cclctl abort`` writes the job's revoke record, each rank that adopts it writes
``revoke_ack/<rank>`` (:func:`cclctl.revocation.ack_key`). This module reads those acks
out of a listing of the job's namespace and words the silent ranks with the verdicts the
live diagnosis already gives (dead, stopped, stale, missing: see
:mod:`cclctl.diagnose.liveness`), never with rules of its own. A rank that is dead or
finished cleanly is not live, so its silence does not make the abort incomplete.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any

from cclctl import limits
from cclctl.diagnose.model import DEAD, MISSING, STALE, STOPPED
from cclctl.diagnose.view import CLOSED
from cclctl.live.culprit import Culprits
from cclctl.live.rank_view import JobView
from cclctl.live.snapshot import JobStatuses, job_prefix
from cclctl.revocation import Revocation, ack_key

ABORT_SCHEMA = "cclctl.abort"
ABORT_VERSION = 1

#: Why a rank did not acknowledge: the liveness verdicts, plus a clean finish and a rank
#: that runs with a fresh status but has not acknowledged (yet).
FINISHED = "finished"
RUNNING = "running"
SILENT_STATES = (DEAD, STOPPED, STALE, MISSING, FINISHED, RUNNING)
#: Ranks in these states are not live: their silence leaves the abort complete.
NOT_LIVE = frozenset({DEAD, FINISHED})

_ACK_HEAD = ack_key(0).rsplit("/", 1)[0] + "/"
_MAX_TEXT = 200


@dataclasses.dataclass(frozen=True)
class Ack:
    """One rank's acknowledgement: where it runs and the call it was in (``""``: none)."""

    rank: int
    pid: int = 0
    host: str = ""
    in_call: str = ""
    time_ns: int = 0

    def words(self) -> str:
        return f"in {self.in_call}" if self.in_call else "between calls"


@dataclasses.dataclass(frozen=True)
class Silent:
    """A rank that did not acknowledge: its ``state`` (:data:`SILENT_STATES`) and why."""

    rank: int
    state: str
    reason: str
    host: str = ""
    pid: int = 0

    @property
    def live(self) -> bool:
        return self.state not in NOT_LIVE


@dataclasses.dataclass(frozen=True)
class AbortReport:
    """What an abort did: the record in the store (``written``: this abort wrote it, else
    it was there already), who acknowledged it within ``wait_s`` and who did not."""

    job: str
    address: str
    world_size: int
    record: Revocation | None
    written: bool
    wait_s: float
    acked: dict[int, Ack]
    silent: list[Silent]
    unreadable_record: str = ""

    @property
    def complete(self) -> bool:
        """Every live rank acknowledged."""
        return not any(s.live for s in self.silent)


def acks_in(listing: Mapping[str, bytes], job: str) -> dict[int, Ack]:
    """Every ``revoke_ack/<rank>`` among ``listing``'s full keys; an ack that cannot be read
    still counts as that rank's (only a rank with the token can write it), without details."""
    head = job_prefix(job) + _ACK_HEAD
    acks: dict[int, Ack] = {}
    for key, value in listing.items():
        text = key[len(head) :] if key.startswith(head) else ""
        if text.isascii() and text.isdigit() and len(text) <= 9:
            rank = limits.rank(int(text), f"ack key {key[:60]}")
            acks[rank] = parse_ack(value, rank)
    return acks


def parse_ack(raw: bytes, rank: int) -> Ack:
    """An ack document, defensively: fields of the wrong type are left out."""
    try:
        data: Any = json.loads(raw)
    except (UnicodeDecodeError, ValueError, RecursionError):
        return Ack(rank)
    if not isinstance(data, dict):
        return Ack(rank)

    def number(name: str) -> int:
        value = data.get(name)
        return value if isinstance(value, int) and not isinstance(value, bool) else 0

    def words(name: str) -> str:
        value = data.get(name)
        return value[:_MAX_TEXT] if isinstance(value, str) else ""

    return Ack(rank, number("pid"), words("host"), words("in_call"), number("time_ns"))


def silent_ranks(
    statuses: JobStatuses, view: JobView, culprits: Culprits, acked: Mapping[int, Ack]
) -> list[Silent]:
    """Every rank of ``view`` without an ack, with the liveness verdict that names it (from
    ``culprits``, the live diagnosis read onto the rows), by rank."""
    silent = []
    for row in sorted(view.ranks, key=lambda r: r.rank):
        if row.rank in acked:
            continue
        snap = statuses.statuses.get(row.rank)
        kind, words = culprits.reasons.get(row.rank, ("", ""))
        if snap is not None and (snap.finished or snap.reason == CLOSED):
            state, why = FINISHED, "finished: closed its communicator and exited"
        elif kind == DEAD:
            state, why = DEAD, "dead: the process is gone"
        elif kind == STOPPED:
            state, why = STOPPED, words
        elif kind == STALE:
            age = row.heartbeat_age_s or 0.0
            state, why = STALE, f"stale heartbeat (last status {age:.1f}s ago)"
        elif kind == MISSING or snap is None:
            state, why = MISSING, f"no status ({row.error or 'none published'})"
        else:
            state, why = RUNNING, "runs with a fresh status, but has not acknowledged"
        silent.append(Silent(row.rank, state, why, row.host, row.pid))
    return silent


def to_document(report: AbortReport) -> dict[str, Any]:
    """``cclctl abort --json``: the ``cclctl.abort`` document, version 1."""
    record = report.record
    return {
        "schema": ABORT_SCHEMA,
        "version": ABORT_VERSION,
        "job": report.job,
        "store": report.address,
        "world_size": report.world_size,
        "written": report.written,
        "record": None if record is None else record.to_dict(),
        "describe": "" if record is None else record.describe(),
        "unreadable_record": report.unreadable_record,
        "wait_s": report.wait_s,
        "complete": report.complete,
        "acknowledged": [dataclasses.asdict(report.acked[r]) for r in sorted(report.acked)],
        "silent": [dataclasses.asdict(s) | {"live": s.live} for s in report.silent],
    }
