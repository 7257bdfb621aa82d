"""Second check, per communicator: ranks behind the frontier of a hung collective.

The frontier is the highest seq that some member has been stuck in. Members that have not
started it and are not inside any call of this communicator never entered their next call:
they are the stragglers. Ranks ahead of the frontier are victims and are never named. Ranks
behind but still inside an older call of this communicator are left to the wait check of
that older call, which can see whom they wait on.
"""

from __future__ import annotations

from cclctl.diagnose import text
from cclctl.diagnose.model import DEAD, NOT_ENTERED, STALE, STOPPED, Verdict
from cclctl.diagnose.view import CommView, RankState
from cclctl.records import COMPLETED

#: Collectives no member can complete unless every member entered them.
NEEDS_ALL = frozenset(("all_reduce", "all_gather", "reduce_scatter", "alltoall", "barrier"))


def check_frontier(
    cv: CommView, states: dict[int, RankState], explained: dict[int, Verdict]
) -> list[Verdict]:
    """``not_entered`` verdicts, one per group of stragglers at the same position.

    A member that is already explained (dead, stopped) is tied to the seq it never entered
    even before the others count as hung; a new verdict needs a hung frontier. A member
    whose last call failed did enter it: its error is for the mismatch and wait checks.
    """
    watched = cv.watched()
    if not watched:
        return []
    frontier = watched[-1]
    hung = cv.hung[-1] if cv.hung else 0
    behind: dict[int, list[int]] = {}  # last started seq -> ranks
    for rank, started in cv.position.items():
        if started < frontier and rank not in cv.inside:
            behind.setdefault(started, []).append(rank)
    where = text.call_at(cv.ops.get(frontier), frontier, cv.comm)
    waits_line = _held_at(cv, states, frontier, where)
    verdicts: list[Verdict] = []
    floor = max((c for c in cv.completed.values() if cv.ops.get(c) in NEEDS_ALL), default=0)
    for rank in sorted(r for r in cv.position if r in explained):
        if explained[rank].kind in (DEAD, STOPPED, STALE):
            _tie(cv, explained[rank], rank, (floor, frontier), waits_line)
    for started in sorted(behind):
        ranks = [r for r in sorted(behind[started]) if r not in explained and not cv.failed(r)]
        if ranks and started < hung:
            verdict = _verdict(cv, states, ranks, started + 1, cv.ops.get(started + 1), waits_line)
            verdicts.append(verdict)
            for rank in ranks:
                explained[rank] = verdict
    return verdicts


def _held_at(cv: CommView, states: dict[int, RankState], seq: int, where: str) -> str:
    """Who is held at ``seq``: the members in flight there (with the longest wait), then the
    members whose call there ended in an error (revoked or aborted: they wait no more)."""
    held = cv.waiters(seq)
    inside = [r for r in held if not cv.failed(r)]
    failed = [r for r in held if cv.failed(r)]
    parts = []
    if inside:
        longest = max(states[r].age_s(cv.open[r]) for r in inside)
        parts.append(
            f"{text.ranks_word(inside)} {text.verb(inside, 'waits', 'wait')} in {where} "
            f"(the longest for {text.seconds(longest)})"
        )
    if failed:
        ended = ", ".join(sorted({cv.open[r].state for r in failed}))
        it = "it" if parts else where
        parts.append(f"{text.ranks_word(failed)} left {it} with an error ({ended})")
    return "; ".join(parts)


def _tie(cv: CommView, known: Verdict, rank: int, bounds: tuple[int, int], waits_line: str) -> None:
    """Tie an explained (dead, stopped, stale) rank to the call it never entered.

    Its last status may lag well behind its death (it publishes about once a second). Where
    every member must take part (all_reduce, all_gather, ...), another member's completing a
    seq proves this rank entered it: that places the verdict. Otherwise its own position is
    only a suggestion, and the wait check (where the others wait on it) places it better.
    Past the floor it is inside no call of its last status any more; inside the floor's own
    call (which the others completed: its status lags, or it stopped in the call's last
    step), it is not what the others wait in either, and the next call is suggested.
    """
    floor, frontier = bounds
    started = cv.position[rank]
    proven = started < floor
    passed = rank in cv.inside and started == floor
    if proven:
        started = floor
        proof = f"the others completed {text.call_at(cv.ops.get(floor), floor, cv.comm)}"
        known.add(f"rank {rank} took part in seq {floor} ({proof})")
    elif passed:
        inside = text.call_at(cv.ops.get(floor), floor, cv.comm)
        known.add(f"rank {rank} was inside {inside} when it last reported; the others completed it")
    if started >= frontier or (rank in cv.inside and not proven and not passed):
        return  # the wait check places a rank inside a call the others are in
    missed = started + 1
    where = text.call_at(cv.ops.get(missed), missed, cv.comm)
    if proven:
        known.add(f"rank {rank} never entered {where}")
        known.place(cv.comm, missed, cv.ops.get(missed))
    else:
        known.add(f"rank {rank} had not entered {where} when it last reported")
        known.suggest(cv.comm, missed, cv.ops.get(missed))
    if waits_line:
        known.add(waits_line)
    known.corroborated = True


def _verdict(
    cv: CommView,
    states: dict[int, RankState],
    ranks: list[int],
    missed: int,
    op: str | None,
    waits_line: str,
) -> Verdict:
    where = text.call_at(op, missed, cv.comm)
    summary = f"{text.ranks_word(ranks)} never entered {where}"
    evidence = [waits_line] if waits_line else []
    evidence += text.grouped(ranks, lambda r: _last_on_comm(cv, states[r]))
    evidence += text.grouped(ranks, lambda r: _instead(states[r]))
    suspects = [states[r].suspect for r in ranks]
    elsewhere = [r for r in ranks if any(rec.comm != cv.comm for rec in states[r].inflight)]
    if elsewhere:
        first = states[elsewhere[0]]
        step = (
            f"the ranks call collectives in a different order: {text.who(first.suspect)} "
            f"{text.activity(first)} while others wait in {where}; check the order of calls "
            f"(and conditions on rank) in the training script. "
            + text.look([states[r] for r in ranks], "the call site")
        )
    else:
        step = text.look([states[r] for r in ranks], f"where it is instead of {where}")
    return Verdict(NOT_ENTERED, summary, suspects, cv.comm, missed, op, evidence, step)


def _last_on_comm(cv: CommView, st: RankState) -> str:
    started = cv.position[st.rank]
    if not started:
        return "never called anything on this communicator"
    rec = st.last(cv.comm)
    what = f"{rec.op} seq {rec.seq}" if rec is not None and rec.seq == started else f"seq {started}"
    if rec is not None and rec.seq == started and rec.state != COMPLETED:
        error = f": {rec.error}" if rec.error else ""
        return f"last called {what} on this communicator, which ended {rec.state}{error}"
    return f"last called {what} on this communicator and completed it"


def _instead(st: RankState) -> str:
    if st.closed:
        return "closed its communicators and finished instead"
    return text.activity(st) + (" instead" if st.inflight else "")
