"""Last check, per communicator: ranks left behind by members that finished.

Some collectives let most members finish without one of them (a broadcast's root and the
branches that do not lead to it): when members closed their communicator cleanly and a
member that did not finish is behind their last call and in no call, the job cannot end
until that member does, though nothing hangs. Only when it has been so for longer than
the hang threshold (by the documents' own times), so a job whose ranks merely end a moment
apart is never flagged.
"""

from __future__ import annotations

from cclctl.diagnose import text
from cclctl.diagnose.model import NOT_ENTERED, Verdict
from cclctl.diagnose.view import CommView, RankState

_NS = 1e9


def check_left_behind(
    cv: CommView, states: dict[int, RankState], explained: dict[int, Verdict], after_s: float
) -> list[Verdict]:
    """One ``not_entered`` verdict for the members left behind, or none."""
    finished = [r for r in cv.members if r in states and states[r].closed]
    if not finished:
        return []
    done_at = max(cv.position.get(r, 0) for r in finished)
    last_done_ns = max(states[r].time_ns for r in finished)
    behind = [
        r
        for r in cv.members
        if r in states
        and not states[r].closed
        and r not in explained
        and r not in cv.inside
        and cv.position.get(r, 0) < done_at
        and (states[r].time_ns - last_done_ns) / _NS > after_s
    ]
    if not behind:
        return []
    missed = min(cv.position.get(r, 0) for r in behind) + 1
    where = text.call_at(cv.ops.get(missed), missed, cv.comm)
    done = f"seq {done_at}"
    verdict = Verdict(
        NOT_ENTERED,
        f"{text.ranks_word(behind)} never entered {where}",
        [states[r].suspect for r in behind],
        evidence=[
            f"{text.ranks_word(finished)} finished (their last call: {done} of comm {cv.comm})",
            *text.grouped(behind, lambda r: f"its last call: seq {cv.position.get(r, 0)}"),
        ],
        next_step=(
            f"the job cannot end until {text.ranks_word(behind)} does: see where "
            f"{text.who(states[behind[0]].suspect)} is (its stack, `py-spy dump`)"
        ),
    )
    verdict.place(cv.comm, missed, cv.ops.get(missed))
    for rank in behind:
        explained[rank] = verdict
    return [verdict]
