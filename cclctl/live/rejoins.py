"""Which ranks rejoined a retry, and at which call: pure, from one listing of the job.

A retry's ranks write ``retry/<comm>/<epoch>/in/<rank>`` (what each brings: the call, the
seq it has not completed) once they agree to re-run, and ``retry/<comm>/<epoch>/up/<rank>``
once their transport of that epoch is up (:mod:`cclctl.runtime.job.retry`). ``cclctl
retry`` reads them here: the newest epoch each rank entered, of the retry it asked for.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping
from typing import Any

from cclctl.live.acks import Silent
from cclctl.live.snapshot import job_prefix
from cclctl.revocation import Revocation

RETRY_SCHEMA = "cclctl.retry"
RETRY_VERSION = 1
_ENTRY = re.compile(
    r"^retry/(?P<comm>[^/]{1,200})/(?P<epoch>[0-9]{1,9})/(?P<what>in|up)/(?P<rank>[0-9]{1,9})$"
)
_MAX_TEXT = 200


@dataclasses.dataclass(frozen=True)
class Rejoin:
    """Rank ``rank`` rejoined communicator ``comm`` under ``epoch`` to re-run ``op`` at
    ``seq``; ``up``: its transport of that epoch is up (the re-run has started)."""

    rank: int
    comm: str
    epoch: int
    op: str
    seq: int
    up: bool = False

    def words(self) -> str:
        running = "re-running" if self.up else "agreed, renewing its links"
        return f"{self.op} seq {self.seq} of comm {self.comm}, epoch {self.epoch}: {running}"


def latest_epochs(listing: Mapping[str, bytes], job: str) -> dict[str, int]:
    """The newest retry epoch of each communicator in ``listing`` (full keys)."""
    epochs: dict[str, int] = {}
    for rel in _relative(listing, job):
        m = _ENTRY.match(rel)
        if m is not None:
            comm, epoch = m["comm"], int(m["epoch"])
            epochs[comm] = max(epoch, epochs.get(comm, 0))
    return epochs


def rejoins_in(
    listing: Mapping[str, bytes],
    job: str,
    after: Mapping[str, int],
    *,
    inclusive: bool,
    world_size: int | None = None,
) -> dict[int, Rejoin]:
    """Each rank's newest rejoin in ``listing`` past ``after`` (a communicator's epoch
    before the retry; ``inclusive``: that epoch counts, for a retry already under way).
    With ``world_size``, only communicators of every rank in job order count (the world,
    whose retry the operator's record asks for): a sub-communicator's entries are keyed by
    its own ranks, not the job's, and it follows no record."""
    entries: dict[tuple[str, int, int], dict[str, bytes]] = {}
    whole = None if world_size is None else ("0" if world_size == 1 else f"0-{world_size - 1}")
    for rel, value in _relative(listing, job).items():
        m = _ENTRY.match(rel)
        if m is None:
            continue
        comm, epoch, rank = m["comm"], int(m["epoch"]), int(m["rank"])
        if whole is not None and comm.partition(":")[2] != whole:
            continue
        floor = after.get(comm, -1 if inclusive else 0)
        if epoch > floor or (inclusive and epoch == floor):
            entries.setdefault((comm, epoch, rank), {})[m["what"]] = value
    found: dict[int, Rejoin] = {}
    for (comm, epoch, rank), parts in sorted(entries.items(), key=lambda kv: kv[0][1]):
        if "in" in parts:
            op, seq = _ask(parts["in"])
            found[rank] = Rejoin(rank, comm, epoch, op, seq, up="up" in parts)
    return found


def _relative(listing: Mapping[str, bytes], job: str) -> dict[str, bytes]:
    head = job_prefix(job)
    return {k[len(head) :]: v for k, v in listing.items() if k.startswith(head)}


def _ask(raw: bytes) -> tuple[str, int]:
    """The call and pending seq of a rank's retry entry, defensively."""
    try:
        data: Any = json.loads(raw)
    except (UnicodeDecodeError, ValueError, RecursionError):
        return "", 0
    if not isinstance(data, dict):
        return "", 0
    call, seq = data.get("call"), data.get("pending")
    return (
        call[:_MAX_TEXT] if isinstance(call, str) else "",
        seq if isinstance(seq, int) and not isinstance(seq, bool) else 0,
    )


@dataclasses.dataclass(frozen=True)
class RetryReport:
    """What a retry did: the record in the store (``written``: this command wrote it, else
    a retry was under way), who rejoined within ``wait_s``, who was aborted instead (its
    communicator cannot retry: rank -> why) and who neither."""

    job: str
    address: str
    world_size: int
    record: Revocation | None
    written: bool
    wait_s: float
    rejoined: dict[int, Rejoin]
    aborted: dict[int, str]
    silent: list[Silent]

    @property
    def running(self) -> list[int]:
        return sorted(r for r, j in self.rejoined.items() if j.up)

    @property
    def missing(self) -> list[int]:
        """Live ranks that did not rejoin at all (no entry, not aborted): exit 3 names them."""
        not_live = {s.rank for s in self.silent if not s.live}
        known = set(self.rejoined) | set(self.aborted) | not_live
        return [r for r in range(self.world_size) if r not in known]

    @property
    def pending(self) -> list[int]:
        """Live ranks that are not re-running (yet): missing, aborted or still renewing."""
        not_live = {s.rank for s in self.silent if not s.live}
        up = set(self.running)
        return [r for r in range(self.world_size) if r not in up and r not in not_live]

    @property
    def complete(self) -> bool:
        """Every live rank re-runs the call."""
        return not self.pending


def to_document(report: RetryReport) -> dict[str, Any]:
    """``cclctl retry --json``: the ``cclctl.retry`` document, version 1."""
    record = report.record
    return {
        "schema": RETRY_SCHEMA,
        "version": RETRY_VERSION,
        "job": report.job,
        "store": report.address,
        "world_size": report.world_size,
        "written": report.written,
        "record": None if record is None else record.to_dict(),
        "describe": "" if record is None else record.describe(),
        "wait_s": report.wait_s,
        "complete": report.complete,
        "rejoined": [dataclasses.asdict(report.rejoined[r]) for r in sorted(report.rejoined)],
        "aborted": [{"rank": r, "reason": why} for r, why in sorted(report.aborted.items())],
        "silent": [dataclasses.asdict(s) | {"live": s.live} for s in report.silent],
        "missing": report.missing,
        "pending": report.pending,
    }
