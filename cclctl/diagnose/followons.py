"""Follow-on failures, read without revoke records (older dumps, Flight Recorder dumps).

When a rank dies or fails, its peers' calls fail too ("link to rank 6 broke while
receiving", "rank 6 failed"), then the peers of those peers, each blaming the rank it last
talked to. Following the blame from rank to rank ends at the cause: a rank the liveness
check explains (dead, stopped, missing), a rank whose call failed by itself (its own error,
a mismatch, a timeout: the other checks name it), or a link: two failed ranks that blame
each other, or a broken link whose far end did not fail. The breaks on the way are the
cause's evidence, never verdicts of their own.

Only the links are verdicts of this module, and only one: the first break (lowest seq, then
the end whose call failed first by its own clock, then the lowest ranks: the tie-breaks, in
that order), with every other link that broke as its evidence, so a cut link 6<->7 is named
as that link and not as every pair that saw the cascade.
"""

from __future__ import annotations

import dataclasses

from cclctl.diagnose import call_facts, links, text
from cclctl.diagnose.model import Verdict
from cclctl.diagnose.view import CommView, RankState
from cclctl.records import CollectiveRecord

#: What a failed rank's error leads to: ("rank", (r,)) or ("link", (a, b)) with a < b.
Cause = tuple[str, tuple[int, ...]]


@dataclasses.dataclass(frozen=True)
class Failure:
    """A rank's first failed call (by its own clock) and the peer its error blames;
    ``broke``: the error says the link broke (its far end may live), not that the peer failed.
    """

    rank: int
    rec: CollectiveRecord
    view: CommView
    blames: int | None
    broke: bool

    @property
    def revoked(self) -> bool:
        """Its call was revoked: the error names the job's origin, not a peer it talked to."""
        return call_facts.revoked(self.rec)

    @property
    def report(self) -> str:
        return f"rank {self.rank}'s call failed: {self.rec.error}"


@dataclasses.dataclass
class FollowOns:
    """Every failed rank's cause, and the one link verdict (if a link is a cause)."""

    failures: dict[int, Failure]
    causes: dict[int, Cause]
    link: Verdict | None = None

    def fold(self, explained: dict[int, Verdict]) -> None:
        """Add each follow-on's failure to the verdict that names its cause: the ranks that
        blame the cause directly, word for word; those behind them, as one line."""
        behind: dict[int, tuple[Verdict, list[int]]] = {}  # by id(verdict)
        revoked: dict[int, tuple[Verdict, list[int]]] = {}
        for rank in sorted(self.causes):
            kind, ends = self.causes[rank]
            verdict = self.link if kind == "link" else explained.get(ends[0])
            if verdict is None or (kind == "rank" and rank in ends):
                continue
            failure = self.failures[rank]
            if failure.revoked:
                revoked.setdefault(id(verdict), (verdict, []))[1].append(rank)
            elif failure.blames in ends:
                verdict.add(failure.report)
            else:
                behind.setdefault(id(verdict), (verdict, []))[1].append(rank)
        for verdict, ranks in revoked.values():
            verdict.add(f"{text.ranks_word(ranks)}: the call was revoked by this failure")
        for verdict, ranks in behind.values():
            verdict.add(
                f"{text.ranks_word(ranks)} failed after {text.verb(ranks, 'a peer', 'peers')} "
                "that had failed (follow-ons: each blames a rank that leads here)"
            )


def follow_ons(
    views: list[CommView], states: dict[int, RankState], explained: dict[int, Verdict]
) -> FollowOns:
    """Trace every failed rank's break to its cause; build the link verdict, if a link is
    one, and record in ``explained`` its ends and those of the links that broke after it."""
    failures = _failures(views)
    causes = {rank: _cause(rank, failures, states, explained) for rank in sorted(failures)}
    found = FollowOns(failures, causes)
    pairs = sorted({ends for kind, ends in causes.values() if kind == "link"})
    if pairs:
        first = min(pairs, key=lambda pair: _when(pair, failures))
        found.link = _link_verdict(first, pairs, failures, states)
        for rank in sorted({r for pair in pairs for r in pair}, key=lambda r: r not in first):
            explained.setdefault(rank, found.link)  # the later breaks are its follow-ons
    return found


def _failures(views: list[CommView]) -> dict[int, Failure]:
    """Each rank's first failed call over every communicator, with whom its error blames."""
    found: dict[int, Failure] = {}
    for cv in views:
        for rank in sorted(cv.open):
            if not cv.failed(rank):
                continue
            rec = cv.open[rank]
            old = found.get(rank)
            if old is not None and (old.rec.end_ns, old.rec.comm) <= (rec.end_ns, rec.comm):
                continue
            broken = call_facts.broken_link(rec)
            edge = call_facts.waited_on(rec) if broken is None else (broken, "")
            blames = None if edge is None else cv.resolve(edge[0])
            found[rank] = Failure(rank, rec, cv, blames, broken is not None)
    return found


def _cause(
    start: int,
    failures: dict[int, Failure],
    states: dict[int, RankState],
    explained: dict[int, Verdict],
) -> Cause:
    """Follow the blame from ``start`` to where it ends (see the module's docstring)."""
    path = [start]
    cur = start
    while True:
        failure = failures[cur]
        peer = failure.blames
        if cur in explained or peer is None or peer == cur:
            return "rank", (cur,)
        if peer in explained:
            return "rank", (peer,)
        if peer in path:
            return _ring(path[path.index(peer) :], failures)
        if peer not in failures:  # the far end did not fail (or left no document)
            if failure.broke and peer in states:
                return "link", (min(cur, peer), max(cur, peer))
            return "rank", (peer,)
        path.append(peer)
        cur = peer


def _ring(ring: list[int], failures: dict[int, Failure]) -> Cause:
    """Failed ranks that blame each other in a ring: the link where it broke first, when
    some blame a broken link; else the rank that failed first (shared memory's "rank k
    failed" cannot start a ring of its own)."""

    def first(ranks: list[int]) -> int:
        return min(ranks, key=lambda r: (failures[r].rec.seq, failures[r].rec.end_ns, r))

    breakers = [r for r in ring if failures[r].broke]
    if not breakers:
        return "rank", (first(ring),)
    if len(ring) == 2:
        return "link", (min(ring), max(ring))
    start = first(breakers)
    peer = failures[start].blames
    assert peer is not None
    return "link", (min(start, peer), max(start, peer))


def _when(pair: tuple[int, ...], failures: dict[int, Failure]) -> tuple[int, int, tuple[int, ...]]:
    """When a link broke: the lowest seq a failure of its ends has, then the earliest end
    time (each end's own clock: a tie-break only), then the ranks."""
    recs = [failures[r].rec for r in pair if r in failures]
    return (min(r.seq for r in recs), min(r.end_ns for r in recs), pair)


def _link_verdict(
    pair: tuple[int, ...],
    pairs: list[tuple[int, ...]],
    failures: dict[int, Failure],
    states: dict[int, RankState],
) -> Verdict:
    a, b = pair
    failure = min((failures[r] for r in pair if r in failures), key=lambda f: f.rec.seq)
    cv = failure.view  # an end still inside an older call (it timed out there) places it
    seq = min([failure.rec.seq] + [cv.open[r].seq for r in pair if r in cv.open])
    evidence = [failures[r].report for r in pair if r in failures and failures[r].blames in pair]
    others = [p for p in pairs if p != pair]
    if others:
        listed = ", ".join(f"{x}<->{y}" for x, y in others[:6])
        more = f" and {len(others) - 6} more" if len(others) > 6 else ""
        evidence.append(
            f"links {listed}{more} broke after it (follow-ons; the first break, by seq and then "
            "by the end that failed first, is the verdict)"
        )
    return links.link_verdict(cv, states, (a, b), seq, evidence)
