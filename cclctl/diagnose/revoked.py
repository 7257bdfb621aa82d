"""The job's revoke records: the origin of its failure is the verdict, the rest its evidence.

A rank that adopted the job's failure carries it in its documents (``revoke``, a
:class:`~cclctl.revocation.Revocation`). Ranks that adopted the same record hold the same
content, so records are grouped by content. When documents disagree (two failures at once),
the first record is the verdict and the others are mentioned: a strong kind (``died``,
``hang``, ``error``, ``aborted``) before one seen from one side (``link``, ``mismatch``),
then the lower epoch, then the lower seq (a failure outside any call last), and only then
the lower ``time_ns`` (wall clocks of different hosts disagree: a tie-break, no more).

The origin's verdict (``died``: the rank is dead, with the reason; ``link``: the link;
``mismatch``: the mismatched rank; ``error``: the rank that failed; ``aborted``: the
operator, blaming no rank) is made before the other checks, so they add their evidence to
it. A ``hang`` names the rank the others wait on, so the checks run first and the verdict
that names the origin becomes the origin's. Every other finding is then this failure's
follow-on: a line of its evidence, not a verdict of its own. A death by SIGTERM, SIGINT or
SIGHUP is a job being stopped: the checks run first, and what they find (the hang it was
stopped for) is the verdict, with the death as its evidence.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection

from cclctl.diagnose import text
from cclctl.diagnose.model import MISSING, Verdict
from cclctl.diagnose.revoke_verdict import RECORD, record_lines, record_verdict
from cclctl.diagnose.view import RankState
from cclctl.records import COMPLETED
from cclctl.revocation import WEAK_KINDS, Revocation

#: A death by one of these is a job being stopped (by a launcher, a scheduler, an operator
#: after a hang), not a fault of its own: what the other checks find comes first.
TEARDOWN = frozenset({"SIGTERM", "SIGINT", "SIGHUP"})


@dataclasses.dataclass
class Revoked:
    """The record that is the verdict, its adopters, the other records, and its verdict
    (None for a hang until the checks have run)."""

    record: Revocation
    adopters: list[int]
    others: list[tuple[Revocation, list[int]]]
    verdict: Verdict | None = None


def order(record: Revocation) -> tuple[bool, int, bool, int, int, int]:
    """Which of two records came first (see the module's docstring)."""
    seq = record.seq
    return (
        record.kind in WEAK_KINDS,
        record.epoch,
        seq is None,
        seq or 0,
        record.time_ns,
        record.origin,
    )


def read_records(states: dict[int, RankState]) -> Revoked | None:
    """The job's records by content, the first one chosen; None when no rank has one."""
    groups: dict[Revocation, list[int]] = {}
    for rank in sorted(states):
        record = states[rank].revoke
        if record is not None:
            groups.setdefault(record, []).append(rank)
    if not groups:
        return None
    ordered = sorted(groups.items(), key=lambda kv: order(kv[0]))
    record, adopters = ordered[0]
    return Revoked(record, adopters, ordered[1:])


def origin_verdict(
    revoked: Revoked, states: dict[int, RankState], explained: dict[int, Verdict]
) -> Verdict | None:
    """The origin's verdict, made before the per-communicator checks (None for a hang);
    its ranks go into ``explained`` so that the checks add their evidence to it."""
    record = revoked.record
    if record.kind == "hang" or _teardown(record):
        return None
    verdict = record_verdict(record, states)
    revoked.verdict = verdict
    for suspect in verdict.suspects:
        explained[suspect.rank] = verdict
    return verdict


def settle(
    revoked: Revoked,
    verdicts: list[Verdict],
    states: dict[int, RankState],
    replaced: Collection[str] = (),
) -> None:
    """Make the origin's verdict the one verdict: a hang takes the verdict that names its
    origin (or one of its own), and every other finding becomes a line of its evidence.
    Where a shrink replaced the record's communicator (``replaced``: such communicators),
    the failure is behind the survivors: the findings of the communicators they run on
    now stay verdicts of their own."""
    record = revoked.record
    if record.comm in replaced:
        past: list[Verdict] = []
        present: list[Verdict] = []
        for v in verdicts:
            (present if v.comm is not None and v.comm not in replaced else past).append(v)
        settle(revoked, past, states)
        verdicts[:] = past + present
        return
    verdict = revoked.verdict
    if verdict is None and _teardown(record):
        before = [v for v in verdicts if v.fault and record.origin not in _ranks(v)]
        if before:  # the job was being stopped: what it was stopped for is the verdict
            first = min(before, key=Verdict.sort_key)
            first.add(f"then the job was stopped: {record.describe()}")
            for other in verdicts:
                if other is not first and other.fault:
                    first.add(f"also: {other.summary}")
            verdicts[:] = [first]
            return
        verdict = record_verdict(record, states)
    if verdict is None:
        # the verdict that names the origin alone: a rank that left no dump, or "ranks
        # 0-3 are dead" once the whole job is gone, says less than the watchdogs' record
        naming = [v for v in verdicts if _ranks(v) == {record.origin} and v.kind != MISSING]
        if naming:
            verdict = min(naming, key=Verdict.sort_key)
            verdict.evidence[:0] = record_lines(record)
        else:
            verdict = record_verdict(record, states)
    verdict.origin = True
    for other in verdicts:
        if other is not verdict and other.fault:
            verdict.add(f"also: {other.summary}")
    verdicts[:] = [verdict]
    _adopters(verdict, revoked, states)


def _teardown(record: Revocation) -> bool:
    return record.kind == "died" and record.reason in TEARDOWN


def _ranks(verdict: Verdict) -> set[int]:
    return {s.rank for s in verdict.suspects}


def _adopters(verdict: Verdict, revoked: Revoked, states: dict[int, RankState]) -> None:
    """Who adopted the record and where, which ranks had not, and the other records: the
    lines after the record's own, ahead of what the checks found."""
    adopted = set(revoked.adopters)
    lines = [f"{text.ranks_word(revoked.adopters)} adopted this failure (the same record)"]
    if revoked.record.kind == "hang":
        lines += _waiting(revoked.record, states)
    lines += text.grouped(
        [r for r in revoked.adopters if r != revoked.record.origin],
        lambda r: f"adopted it {_where(states[r], revoked.record.comm)}",
    )
    later = {r for _, ranks in revoked.others for r in ranks}
    without = [r for r in sorted(states) if r not in adopted and r not in later]
    if without:
        lines.append(f"{text.ranks_word(without)} had adopted no failure when they last wrote")
    for record, ranks in revoked.others:
        why = _why_first(revoked.record, record)
        lines.append(
            f"a second failure at the same time, adopted by {text.ranks_word(ranks)}: "
            f"{record.describe()} (mentioned, not the verdict: {why})"
        )
    first = 1 if verdict.evidence and verdict.evidence[0].startswith(RECORD) else 0
    verdict.evidence[first:first] = [line for line in lines if line not in verdict.evidence]


def _waiting(record: Revocation, states: dict[int, RankState]) -> list[str]:
    """Who waits inside the call a hang record names (on its origin)."""
    ranks = [
        r
        for r in sorted(states)
        if r != record.origin
        and any(c.comm == record.comm and c.seq == record.seq for c in states[r].inflight)
    ]
    if not ranks:
        return []
    verb = text.verb(ranks, "waits", "wait")
    where = f"{record.at()} of comm {record.comm}"
    return [f"{text.ranks_word(ranks)} {verb} on rank {record.origin} in {where}"]


def _why_first(first: Revocation, other: Revocation) -> str:
    if (first.kind in WEAK_KINDS) != (other.kind in WEAK_KINDS):
        return f"a {first.kind} record comes before a {other.kind} one"
    if first.epoch != other.epoch or first.seq != other.seq:
        return "the verdict's record hit an earlier call"
    return "the verdict's record is older by its time_ns, a tie-break only (clocks differ)"


def _where(st: RankState, comm: str) -> str:
    """The call a rank was in (in flight, or its last one that did not complete), of
    ``comm`` where it names one (a rank that shrank past it runs in another now)."""
    calls = [c for c in st.inflight if comm in ("", c.comm)]
    calls += [
        c
        for name in sorted(st.tail)
        if comm in ("", name) and (c := st.last(name)) and c.state != COMPLETED
    ]
    return f"in {text.call(calls[0])}" if calls else "between calls"
