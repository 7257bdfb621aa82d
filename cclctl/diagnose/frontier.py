"""Second check, per communicator: ranks behind the frontier of a hung collective.

The frontier is the highest seq that some member has been stuck in. Members that have not
started it and are not inside any call of this communicator never entered their next call:
they are the stragglers. Ranks ahead of the frontier are victims and are never named. Ranks
behind but still inside an older call of this communicator are left to the wait check of
that older call, which can see whom they wait on.
"""

from __future__ import annotations

from cclctl.diagnose import text
from cclctl.diagnose.model import NOT_ENTERED, Verdict
from cclctl.diagnose.view import CommView, RankState
from cclctl.records import COMPLETED


def check_frontier(
    cv: CommView, states: dict[int, RankState], explained: dict[int, Verdict]
) -> list[Verdict]:
    """``not_entered`` verdicts, one per group of stragglers at the same position."""
    if not cv.hung:
        return []
    frontier = cv.hung[-1]
    behind: dict[int, list[int]] = {}  # last started seq -> ranks
    for rank, started in cv.position.items():
        if started < frontier and rank not in cv.inside:
            behind.setdefault(started, []).append(rank)
    waiting = cv.waiters(frontier)
    where = text.call_at(cv.ops.get(frontier), frontier, cv.comm)
    waits_line = (
        f"{text.ranks_word(waiting)} {text.verb(waiting, 'waits', 'wait')} in {where} "
        f"(the longest for {text.seconds(cv.longest_wait_s(states, frontier))})"
    )
    verdicts: list[Verdict] = []
    for started in sorted(behind):
        ranks = sorted(behind[started])
        missed = started + 1
        op = cv.ops.get(missed)
        for rank in [r for r in ranks if r in explained]:
            known = explained[rank]
            known.add(f"rank {rank} never entered {text.call_at(op, missed, cv.comm)}")
            known.add(waits_line)
            known.place(cv.comm, missed, op)
            known.corroborated = True
        fresh = [r for r in ranks if r not in explained]
        if fresh:
            verdict = _verdict(cv, states, fresh, missed, op, waits_line)
            verdicts.append(verdict)
            for rank in fresh:
                explained[rank] = verdict
    return verdicts


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
    evidence = [waits_line]
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
            + text.py_spy(suspects, "the call site")
        )
    else:
        step = text.py_spy(suspects, f"where it is instead of {where}")
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
    return text.activity(st) + (" instead" if st.inflight else "")
