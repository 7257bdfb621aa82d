"""What a shrink's survivors agree on and which calls re-run among them
(``CCLCTL_ON_FAILURE=shrink``; the policy is :mod:`~.shrinking`, the agreement in the job's
store :mod:`cclctl.runtime.job.shrink`).

A call whose buffers do not depend on the world re-runs among the survivors from its input
(:data:`RERUNS`): all_reduce, barrier, and broadcast and reduce, whose root keeps its
place where it survived (renumbered; a dead root makes them raise). all_gather,
reduce_scatter, all_to_all and all_to_allv cannot: their buffers are sized for the old
world's ranks, so the result the caller holds has no meaning among fewer; they raise
:class:`~cclctl.errors.CommShrunk` once the communicator has shrunk, saying so
(:data:`SIZED_BY_WORLD`), for the caller to redo them with buffers for the new world.

A dead rank can leave the survivors one call apart (:data:`CAUGHT_UP`): where the ranks
behind are in an all_reduce or a broadcast, they take its result from a rank ahead; in a
barrier, they return; in a reduce, the ranks ahead run it again among the survivors from
its kept input, with the ranks behind. Survivors further apart (a run of broadcasts or
reduces, which tell their root nothing) cannot be made exact, and raise.
"""

from __future__ import annotations

import dataclasses

from cclctl.errors import CommError

#: The calls that re-run among the survivors where all stopped at the same seq.
RERUNS = ("all_reduce", "barrier", "broadcast", "reduce")
#: The calls whose buffers are sized for the world: after a shrink they cannot re-run.
SIZED_BY_WORLD = ("all_gather", "reduce_scatter", "all_to_all", "all_to_allv")
#: The calls a survivor one call behind catches up on with the survivors ahead.
CAUGHT_UP = ("all_reduce", "barrier", "broadcast", "reduce")
#: ... the ones whose result every rank holds alike: kept, for a survivor behind to take.
SHARED = ("all_reduce", "broadcast")


@dataclasses.dataclass(frozen=True)
class ShrinkInfo:
    """What the survivors agreed on: the shrink's number, the global ranks it dropped, and
    each new rank's last completed seq (``done``) and last kept call's seq (``kept``)
    of the old communicator, and the call it was interrupted in (``call``: "" if none)."""

    n: int
    excluded: list[int]
    done: dict[int, int]
    kept: dict[int, int]
    call: dict[int, str]


def shrinkable(exc: CommError) -> bool:
    """A failure a shrink recovers from: a rank died (the revoke record says so)."""
    rev = exc.revocation
    return rev is not None and rev.kind == "died"


def why_not_rerun(op: str, old_size: int, new_size: int) -> str:
    """Why a call of ``op`` that a death interrupted does not re-run among the survivors,
    in words (empty where it does)."""
    if op in RERUNS:
        return ""
    if op in SIZED_BY_WORLD:
        return (
            f"{op} cannot re-run itself: its buffers are sized for the {old_size} ranks "
            f"before the shrink, not the {new_size} after"
        )
    return f"{op or 'this call'} cannot re-run itself"
