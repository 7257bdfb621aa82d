"""Verdicts that name a link rather than a rank: the wait check finds them, this words them.

A link is suspect when a rank's call failed on it (dropped, or broken while sending or
receiving, with the far end alive: :mod:`.followons` finds those), when two ranks wait on
each other, when a rank waits on a peer that already left the call (the message never
arrived), or where a longer cycle of waits breaks: at a rank waiting to *send* (the far end
does not drain), else at the lowest algorithm step (the data stopped there). When nothing
tells, no link is named.
"""

from __future__ import annotations

from cclctl.diagnose import text
from cclctl.diagnose.call_facts import Edge
from cclctl.diagnose.model import LINK, STUCK, Suspect, Verdict
from cclctl.diagnose.view import CommView, RankState


def link_verdict(
    cv: CommView, states: dict[int, RankState], pair: tuple[int, int], seq: int, evidence: list[str]
) -> Verdict:
    a, b = sorted(pair)
    suspects = [_suspect(states, a), _suspect(states, b)]
    where = text.call_at(cv.ops.get(seq), seq, cv.comm)
    summary = f"link {a}<->{b} is broken or stalled: ranks {a} and {b} stop in {where}"
    step = link_step(suspects)
    return Verdict(LINK, summary, suspects, cv.comm, seq, cv.ops.get(seq), evidence, step, (a, b))


def link_step(suspects: list[Suspect]) -> str:
    """What to check for the link between two suspects: the network, or the local path."""
    a, b = suspects[0].rank, suspects[1].rank
    if suspects[0].host != suspects[1].host:
        return (
            f"check the link between {_hosts(suspects)} (ranks {a} and {b}): NIC and switch "
            "error counters, `ping`, `cclctl probe`"
        )
    return (
        f"ranks {a} and {b} share {_hosts(suspects)}: check the local path between them "
        "(shared memory, loopback) and whether one of them is starved of CPU"
    )


def cycle(
    cv: CommView,
    states: dict[int, RankState],
    ring: list[int],
    waiters: list[int],
    edges: dict[int, Edge],
    seq: int,
) -> Verdict:
    """A cycle of waits: the link where it breaks, or a verdict that names nobody."""
    where = text.call_at(cv.ops.get(seq), seq, cv.comm)
    chain = "; ".join(f"{r} -> {edges[r][0]} ({edges[r][1] or 'wait'})" for r in ring[:8])
    evidence = [f"{text.ranks_word(ring)} wait on each other in {where}: {chain}"]
    pair = _break(cv, ring, edges, evidence)
    others = [r for r in waiters if r not in ring]
    if others:
        evidence.append(f"{text.ranks_word(others)} wait on them")
    if pair is None:
        summary = f"{text.ranks_word(ring)} wait on each other in a cycle in {where}"
        step = (
            "no single rank or link stands out: measure the links between these ranks "
            "(cclctl probe) and compare their NIC counters"
        )
        return Verdict(STUCK, summary, [], cv.comm, seq, cv.ops.get(seq), evidence, step)
    return link_verdict(cv, states, pair, seq, evidence)


def _break(
    cv: CommView, ring: list[int], edges: dict[int, Edge], evidence: list[str]
) -> tuple[int, int] | None:
    if len(ring) == 2:
        return ring[0], ring[1]
    senders = [r for r in ring if edges[r][1] == "send"]
    if senders:
        r = senders[0]
        evidence.append(f"rank {r} waits to send to rank {edges[r][0]}: that end does not drain")
        return r, edges[r][0]
    steps = {r: cv.open[r].step for r in ring}
    low = min(steps.values())
    lowest = [r for r in ring if steps[r] == low]
    if len(lowest) == 1 and len(set(steps.values())) > 1:
        r = lowest[0]
        peer = edges[r][0]
        evidence.append(
            f"rank {r} is at step {low}, behind the others: data from rank {peer} stopped there"
        )
        return r, peer
    return None


def left(
    cv: CommView,
    states: dict[int, RankState],
    target: int,
    direct: list[int],
    line: str,
    seq: int,
) -> Verdict:
    """Ranks wait on ``target``, which already finished the call: what it sent was lost."""
    where = text.call_at(cv.ops.get(seq), seq, cv.comm)
    summary = (
        f"{text.ranks_word(direct)} {text.verb(direct, 'waits', 'wait')} on rank {target} in "
        f"{where}, but rank {target} already finished it"
    )
    evidence = [line]
    if target in states:
        evidence.append(f"rank {target} {text.activity(states[target])}")
    if len(direct) == 1:
        verdict = link_verdict(cv, states, (direct[0], target), seq, evidence)
        verdict.summary = summary
        return verdict
    suspects = [_suspect(states, target)]  # the waiting ranks are evidence, not suspects
    step = (
        f"a message from rank {target} never arrived: check its links to "
        f"{text.ranks_word(direct)}, or whether it skipped a call"
    )
    return Verdict(STUCK, summary, suspects, cv.comm, seq, cv.ops.get(seq), evidence, step)


def _suspect(states: dict[int, RankState], rank: int) -> Suspect:
    return states[rank].suspect if rank in states else Suspect(rank)


def _hosts(suspects: list[Suspect]) -> str:
    hosts = sorted({s.host for s in suspects if s.host})
    if not hosts:
        return "their hosts"
    return hosts[0] if len(hosts) == 1 else " and ".join(hosts)
