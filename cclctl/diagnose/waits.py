"""Last check, per hung collective: follow ``waiting_on`` from rank to rank to where it ends.

Inside one collective every rank waits on at most one peer, so the waits form chains that
end in one of three ways: at a rank that waits on nobody (busy inside the call, or it left
with an error), at a rank outside the call (it finished it already, or a check before this
one has explained it), or in a cycle. A cycle of two ranks waiting on each other is a link
that carries nothing: ``link 2<->3``. A longer cycle is broken where a rank's call failed on
a link, else where a rank waits to *send* (the far end does not drain), else where the
lowest algorithm step is (the data stopped there); when none tells, no rank is named.
"""

from __future__ import annotations

import re

from cclctl.diagnose import text
from cclctl.diagnose.model import STUCK, Suspect, Verdict
from cclctl.diagnose.view import CommView, RankState, in_flight
from cclctl.ranges import fold_ranks
from cclctl.records import FAILED

#: Peers named by the runtime's own error messages, for records whose waits were cleared.
_PEER_IN_ERROR = re.compile(
    r"waiting to (?P<what>send|recv) (?:to|from) rank (?P<peer>\d+)"
    r"|link to rank (?P<peer2>\d+) broke while (?P<what2>sending|receiving)"
)

Edge = tuple[int, str]  # (peer, "send" | "recv" | "")
Terminal = tuple[str, tuple[int, ...]]  # ("idle" | "outside" | "cycle", ranks)


def check_waits(
    cv: CommView, states: dict[int, RankState], explained: dict[int, Verdict]
) -> list[Verdict]:
    """``stuck`` verdicts for every hung seq of this communicator, oldest seq first."""
    verdicts: list[Verdict] = []
    for seq in cv.hung:
        verdicts += _at_seq(cv, states, explained, seq)
    return verdicts


def _at_seq(
    cv: CommView, states: dict[int, RankState], explained: dict[int, Verdict], seq: int
) -> list[Verdict]:
    inside = set(cv.waiters(seq))
    edges = {r: e for r in sorted(inside) if (e := _edge(cv, r)) is not None}
    terminals = _terminals(inside, edges, explained)
    groups: dict[Terminal, list[int]] = {}
    for rank in sorted(terminals):
        groups.setdefault(terminals[rank], []).append(rank)
    op = cv.ops.get(seq)
    where = text.call_at(op, seq, cv.comm)
    verdicts: list[Verdict] = []
    for term in sorted(groups, key=lambda t: (t[1], t[0])):
        waiters = groups[term]
        kind, ends = term
        if kind == "outside" and ends[0] in explained:
            known = explained[ends[0]]
            known.add(_waits_on_line(waiters, ends[0], edges, where))
            known.place(cv.comm, seq, op)
            known.corroborated = True
            continue
        verdict = _verdict(cv, states, term, waiters, edges, seq, where)
        if verdict is not None:
            verdicts.append(verdict)
            for suspect in verdict.suspects:
                explained.setdefault(suspect.rank, verdict)
    if not verdicts and not any(r in explained for r in cv.members):
        verdicts.append(_unexplained(cv, states, sorted(inside), seq, where))
    return verdicts


def _edge(cv: CommView, rank: int) -> Edge | None:
    rec = cv.open[rank]
    if rec.waiting_on is not None:
        return cv.resolve(rec.waiting_on), rec.waiting_for or ""
    match = _PEER_IN_ERROR.search(rec.error or "")
    if match is None:
        return None
    peer = int(match["peer"] or match["peer2"])
    what = match["what"] or ("send" if match["what2"] == "sending" else "recv")
    return cv.resolve(peer), what


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
    line = (
        f"{text.ranks_word(first)} {text.verb(first, 'waits', 'wait')} on rank {target} in {where}"
    )
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
    where: str,
) -> Verdict | None:
    kind, ends = term
    if kind == "cycle":
        return _cycle(cv, states, list(ends), waiters, edges, seq, where)
    target = ends[0]
    if not [r for r in waiters if r != target]:
        return None  # a rank between two steps that nobody waits on: not a finding
    line = _waits_on_line(waiters, target, edges, where)
    suspect = states[target].suspect if target in states else Suspect(target)
    op = cv.ops.get(seq)
    if kind == "idle":
        rec = cv.open[target]
        st = states[target]
        if in_flight(rec):
            summary = f"rank {target} is inside {where} but waits on nobody"
            detail = f"rank {target} has been in it {text.seconds(st.age_s(rec))}, step "
            detail += f"{rec.step}/{rec.steps}" if rec.steps else f"{rec.step}"
            step = text.py_spy([suspect], "where it is busy inside the collective")
        else:
            summary = f"rank {target} left {where} with an error"
            detail = f"rank {target}'s call ended {rec.state}: {rec.error or 'no message'}"
            step = f"read the error and log of {text.who(suspect)}: the others wait for it"
        return Verdict(STUCK, summary, [suspect], cv.comm, seq, op, [line, detail], step)
    older = cv.open.get(target)
    if older is not None and older.seq < seq and older.seq in cv.hung:
        return None  # it waits in an older call of this communicator; that call's verdict
    direct = sorted(r for r in waiters if edges.get(r, (-1, ""))[0] == target)
    started = cv.position.get(target, 0)
    state = "already finished it" if started >= seq else f"last started seq {started}"
    summary = (
        f"{text.ranks_word(direct)} wait on rank {target} in {where}, but rank {target} {state}"
    )
    suspects = sorted({suspect, *(states[r].suspect for r in direct)})
    link = (min(direct[0], target), max(direct[0], target)) if len(direct) == 1 else None
    evidence = [line, f"rank {target} {text.activity(states[target])}" if target in states else ""]
    step = (
        f"a message from rank {target} never arrived: check the link between "
        f"{_hosts(suspects)} (ranks {fold_ranks(s.rank for s in suspects)}), "
        f"or whether rank {target} skipped a call"
    )
    return Verdict(
        STUCK, summary, suspects, cv.comm, seq, op, [e for e in evidence if e], step, link
    )


def _cycle(
    cv: CommView,
    states: dict[int, RankState],
    ring: list[int],
    waiters: list[int],
    edges: dict[int, Edge],
    seq: int,
    where: str,
) -> Verdict:
    op = cv.ops.get(seq)
    chain = "; ".join(f"{r} -> {edges[r][0]} ({edges[r][1] or 'wait'})" for r in ring[:8])
    evidence = [f"{text.ranks_word(ring)} wait on each other in {where}: {chain}"]
    link = _broken_link(cv, ring, edges, evidence)
    if link is None:
        summary = f"{text.ranks_word(ring)} wait on each other in a cycle in {where}"
        step = (
            "no single rank or link stands out: measure the links between these ranks "
            "(cclctl probe) and compare their NIC counters"
        )
        return Verdict(STUCK, summary, [], cv.comm, seq, op, evidence, step)
    a, b = link
    suspects = [states[a].suspect, states[b].suspect]
    others = [r for r in waiters if r not in link]
    if others:
        evidence.append(f"{text.ranks_word(others)} wait on them")
    summary = f"link {a}<->{b} is broken or stalled: ranks {a} and {b} stop in {where}"
    hosts = _hosts(suspects)
    step = (
        f"check the link between {hosts} (ranks {a} and {b}): NIC and switch error "
        "counters, `ping`, `cclctl probe`"
        if suspects[0].host != suspects[1].host
        else f"ranks {a} and {b} share {hosts}: check the local path between them "
        "(shared memory, loopback) and whether one of them is starved of CPU"
    )
    return Verdict(STUCK, summary, suspects, cv.comm, seq, op, evidence, step, (a, b))


def _broken_link(
    cv: CommView, ring: list[int], edges: dict[int, Edge], evidence: list[str]
) -> tuple[int, int] | None:
    if len(ring) == 2:
        return ring[0], ring[1]
    broken = [
        r
        for r in ring
        if cv.open[r].state == FAILED and _PEER_IN_ERROR.search(cv.open[r].error or "")
    ]
    if broken:
        r = broken[0]
        evidence.append(f"rank {r} reports: {cv.open[r].error}")
        return min(r, edges[r][0]), max(r, edges[r][0])
    senders = [r for r in ring if edges[r][1] == "send"]
    if senders:
        r = senders[0]
        evidence.append(f"rank {r} waits to send to rank {edges[r][0]}: that end does not drain")
        return min(r, edges[r][0]), max(r, edges[r][0])
    steps = {r: cv.open[r].step for r in ring}
    low = min(steps.values())
    lowest = [r for r in ring if steps[r] == low]
    if len(lowest) == 1 and len(set(steps.values())) > 1:
        r = lowest[0]
        peer = edges[r][0]
        evidence.append(
            f"rank {r} is at step {low}, behind the others: data from rank {peer} stopped there"
        )
        return min(r, peer), max(r, peer)
    return None


def _unexplained(
    cv: CommView, states: dict[int, RankState], inside: list[int], seq: int, where: str
) -> Verdict:
    longest = cv.longest_wait_s(states, seq)
    summary = f"{where} is hung and no rank says whom it waits on"
    are = text.verb(inside, "is", "are")
    evidence = [
        f"{text.ranks_word(inside)} {are} inside it (the longest for {text.seconds(longest)})"
    ]
    step = "py-spy dump every rank of the communicator and compare where they wait"
    return Verdict(STUCK, summary, [], cv.comm, seq, cv.ops.get(seq), evidence, step)


def _hosts(suspects: list[Suspect]) -> str:
    hosts = sorted({s.host for s in suspects if s.host})
    if not hosts:
        return "their hosts"
    return hosts[0] if len(hosts) == 1 else " and ".join(hosts)
