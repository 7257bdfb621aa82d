"""Communicators a shrink replaced: the survivors left them for one of their own.

``comm.shrink()`` leaves the old communicator where the failure stopped it (its calls
failed, its members' last started and completed seqs apart) and goes on in a new one,
``<n>:<survivors>``. The old one is not hung: it was shrunk. A communicator ``B`` replaced
``A`` when it was created later (a higher creation index), its members are ``A``'s minus
ranks the diagnosis already explains (dead, stopped, stale, missing, the revoke record's
origin), and every member of ``B`` seen has started a call on it. What the shrink left out
is then history: a hang of ``B`` is the fault to report first.
"""

from __future__ import annotations

from cclctl.diagnose import text
from cclctl.diagnose.model import Verdict
from cclctl.diagnose.view import CommView
from cclctl.ranges import fold_ranks


def _index(comm: str) -> int | None:
    head = comm.partition(":")[0]
    return int(head) if head.isdigit() else None


def successors(views: list[CommView], explained: set[int]) -> dict[str, CommView]:
    """Each replaced communicator's id -> the view of the one that replaced it."""
    found: dict[str, CommView] = {}
    for old in views:
        for new in views:
            a, b = _index(old.comm), _index(new.comm)
            if a is None or b is None or b <= a or not new.member_set < old.member_set:
                continue
            if not (old.member_set - new.member_set) <= explained:
                continue
            if new.position and all(seq >= 1 for seq in new.position.values()):
                found[old.comm] = new
                break
    return found


def note_shrinks(
    verdicts: list[Verdict], replaced: dict[str, CommView], views: list[CommView]
) -> None:
    """Add to each verdict naming a rank a shrink left out that the survivors run on; one
    that names only such ranks is history (``shrunk_away``), reported after the faults of
    the communicators that run now, and its next step no longer asks for the shrink."""
    members = {cv.comm: cv.member_set for cv in views}
    for old, new in replaced.items():
        left = members[old] - new.member_set
        ranks = f"{'rank' if len(left) == 1 else 'ranks'} {fold_ranks(left)}"
        line = (
            f"comm {old} shrank to {new.comm} without {ranks}: the survivors run on "
            f"(up to seq {max(new.position.values())})"
        )
        for verdict in verdicts:
            named = {s.rank for s in verdict.suspects}
            if not named & left:
                continue
            verdict.add(line)
            if named <= left and verdict.shrunk_away is None:
                verdict.shrunk_away = new.comm
                whom = ", ".join(text.who(s) for s in verdict.suspects)
                verdict.next_step = (
                    f"the survivors run on without {ranks} in comm {new.comm} (nothing to "
                    f"restart); the log and exit status of {whom} say why it left"
                )
