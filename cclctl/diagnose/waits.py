"""Last check, per hung collective: follow ``waiting_on`` from rank to rank to where it ends.

Inside one collective every rank waits on at most one peer, so the waits form chains that
end in one of three ways: at a rank that waits on nobody (busy inside the call, or it left
with an error), at a rank outside the call (it finished it already, or a check before this
one has explained it), or in a cycle (see :mod:`.links`). Calls that failed on a broken link
were traced to their cause before this check (:mod:`.followons`), so a link is named once,
as its cause, and never for every pair that saw the cascade. Where a call's ``waiting_on`` was
cleared (it timed out or failed), the runtime's error message still names the peer.
"""

from __future__ import annotations

from cclctl.diagnose import call_facts, links, text
from cclctl.diagnose.call_facts import Edge
from cclctl.diagnose.model import STUCK, Suspect, Verdict
from cclctl.diagnose.view import CommView, RankState, in_flight

Terminal = tuple[str, tuple[int, ...]]  # ("idle" | "outside" | "cycle", ranks)


def check_waits(
    cv: CommView, states: dict[int, RankState], explained: dict[int, Verdict]
) -> list[Verdict]:
    """Verdicts for every hung seq of this communicator, oldest first. Seqs watched only
    because a member is doomed add evidence to that member's verdict and name nobody new.
    """
    hung = set(cv.hung)
    verdicts: list[Verdict] = []
    for seq in cv.watched():
        verdicts += _at_seq(cv, states, explained, seq, seq in hung)
    return verdicts


def _at_seq(
    cv: CommView,
    states: dict[int, RankState],
    explained: dict[int, Verdict],
    seq: int,
    hung: bool,
) -> list[Verdict]:
    inside = sorted(cv.waiters(seq))
    verdicts: list[Verdict] = []
    edges = {r: e for r in inside if (e := _edge(cv, r)) is not None}
    groups: dict[Terminal, list[int]] = {}
    for rank, term in sorted(_terminals(set(inside), edges, explained).items()):
        groups.setdefault(term, []).append(rank)
    where = text.call_at(cv.ops.get(seq), seq, cv.comm)
    for term in sorted(groups, key=lambda t: (t[1], t[0])):
        waiters = groups[term]
        kind, ends = term
        if kind == "outside" and ends[0] in explained:
            known = explained[ends[0]]
            known.add(_waits_on_line(waiters, ends[0], edges, where))
            known.place(cv.comm, seq, cv.ops.get(seq))
            known.corroborated = True
            continue
        verdict = _verdict(cv, states, term, waiters, edges, seq) if hung else None
        if verdict is not None:
            verdicts.append(verdict)
            for suspect in verdict.suspects:
                explained.setdefault(suspect.rank, verdict)
    if hung and not verdicts and not any(r in explained for r in cv.members):
        verdicts.append(_unexplained(cv, states, inside, seq, where))
    return verdicts


def _edge(cv: CommView, rank: int) -> Edge | None:
    """Whom ``rank`` waits on: for a failed call, the peer its error blames (what it waited
    on before is stale), else its ``waiting_on``, else what its error says."""
    rec = cv.open[rank]
    edge = call_facts.waited_on(rec)
    if rec.waiting_on is not None and (edge is None or in_flight(rec)):
        return cv.resolve(rec.waiting_on), rec.waiting_for or ""
    return None if edge is None else (cv.resolve(edge[0]), edge[1])


def _terminals(
    inside: set[int], edges: dict[int, Edge], explained: dict[int, Verdict]
) -> dict[int, Terminal]:
    """Where each rank's chain of waits ends. Explained ranks end chains: what they say about
    their own waits is stale (a dead or stopped rank waits on nobody any more).
    """
    memo: dict[int, Terminal] = {}
    for start in sorted(inside):
        path: list[int] = []
        index: dict[int, int] = {}
        term: Terminal
        cur = start
        while True:
            if cur not in inside or (cur in explained and cur != start):
                term = ("outside", (cur,))
                break
            if cur in memo:
                term = memo[cur]
                break
            if cur in index:
                term = ("cycle", tuple(sorted(path[index[cur] :])))
                break
            index[cur] = len(path)
            path.append(cur)
            edge = edges.get(cur)
            if edge is None or cur in explained or edge[0] == cur:
                term = ("idle", (cur,))
                break
            cur = edge[0]
        for node in path:
            memo[node] = term
    return memo


def _waits_on_line(waiters: list[int], target: int, edges: dict[int, Edge], where: str) -> str:
    direct = [r for r in waiters if r != target and edges.get(r, (-1, ""))[0] == target]
    through = [r for r in waiters if r != target and r not in direct]
    first = direct or through
    line = f"{text.ranks_word(first)} {text.verb(first, 'waits', 'wait')} on rank {target} in "
    line += where
    if direct and through:
        line += f"; {text.ranks_word(through)} {text.verb(through, 'waits', 'wait')} on it "
        line += "through other ranks"
    return line


def _verdict(
    cv: CommView,
    states: dict[int, RankState],
    term: Terminal,
    waiters: list[int],
    edges: dict[int, Edge],
    seq: int,
) -> Verdict | None:
    kind, ends = term
    if kind == "cycle":
        return links.cycle(cv, states, list(ends), waiters, edges, seq)
    target = ends[0]
    if not [r for r in waiters if r != target]:
        return None  # a rank between two steps that nobody waits on: not a finding
    where = text.call_at(cv.ops.get(seq), seq, cv.comm)
    line = _waits_on_line(waiters, target, edges, where)
    if kind == "idle":
        return _idle(cv, states[target], line, seq, where)
    if cv.position.get(target, 0) < seq:
        return None  # behind: the frontier check, or an older call's waits, speak for it
    direct = sorted(r for r in waiters if edges.get(r, (-1, ""))[0] == target)
    return links.left(cv, states, target, direct, line, seq)


def _idle(cv: CommView, st: RankState, line: str, seq: int, where: str) -> Verdict:
    """The chain ends at a rank inside the call that waits on nobody."""
    rec = cv.open[st.rank]
    suspect: Suspect = st.suspect
    if in_flight(rec):
        summary = f"rank {st.rank} is inside {where} but waits on nobody"
        detail = f"rank {st.rank} has been in it {text.seconds(st.age_s(rec))}, step "
        detail += f"{rec.step}/{rec.steps}" if rec.steps else f"{rec.step}"
        step = text.look([st], "where it is busy inside the collective")
    else:
        summary = f"rank {st.rank} left {where} with an error"
        detail = f"rank {st.rank}'s call ended {rec.state}: {rec.error or 'no message'}"
        step = f"read the error and log of {text.who(suspect)}: the others wait for it"
    return Verdict(STUCK, summary, [suspect], cv.comm, seq, cv.ops.get(seq), [line, detail], step)


def _unexplained(
    cv: CommView, states: dict[int, RankState], inside: list[int], seq: int, where: str
) -> Verdict:
    longest = cv.longest_wait_s(states, seq)
    summary = f"{where} is hung and no rank says whom it waits on"
    are = text.verb(inside, "is", "are")
    evidence = [
        f"{text.ranks_word(inside)} {are} inside it (the longest for {text.seconds(longest)})"
    ]
    step = text.compare_all([states[r] for r in inside])
    verdict = Verdict(STUCK, summary, [], cv.comm, seq, cv.ops.get(seq), evidence, step)
    verdict.look_at = inside
    return verdict
