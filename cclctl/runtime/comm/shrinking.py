"""``CCLCTL_ON_FAILURE=shrink``: a call that a dead rank interrupted re-runs among the survivors.

The communicator shrinks in place (the same object now holds the survivors, with new rank
numbers and a new comm id), so a training loop carries on without code changes; callbacks
registered with ``comm.on_shrink`` hear of each shrink, with the ranks it dropped. Only
calls whose result does not depend on the world re-run by themselves (``all_reduce`` and
``barrier``); the others raise :class:`~cclctl.errors.CommShrunk` once the communicator has
shrunk, since their buffers or root change with the world.

A re-run starts from the call's inputs: an in-place all_reduce keeps a copy of its input
(only with this policy on), so a partly reduced buffer is never used. A dead rank can leave
the survivors one call apart (some completed seq k, which holds its contribution, others
did not): every survivor keeps its last all_reduce result, and the survivors behind
receive it from one ahead, so every rank ends up with the same result for every seq.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from cclctl.errors import CommError, CommShrunk
from cclctl.runtime.comm.rerun import Inputs, Kept

if TYPE_CHECKING:
    from cclctl.runtime.comm.communicator import Communicator

#: ``shrink(comm, exclude, timeout_s, call)``: the job's way of building the survivors'
#: communicator (:mod:`cclctl.runtime.job.shrink`); ``call`` names the interrupted call.
Shrinker = Callable[["Communicator", "frozenset[int]", "float | None", str], "Communicator"]
#: ``callback(comm, excluded)``: told after an automatic shrink (``excluded``: global ranks).
OnShrink = Callable[["Communicator", "list[int]"], None]

RERUNS = ("all_reduce", "barrier")


@dataclasses.dataclass(frozen=True)
class ShrinkInfo:
    """What the survivors agreed on: the shrink's number, the global ranks it dropped, and
    each new rank's last completed seq (``done``) and last kept all_reduce seq (``kept``)
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


def all_reduce(comm: Communicator, buf: np.ndarray, op: str, out: np.ndarray | None) -> Any:
    """``comm.all_reduce`` that shrinks away a dead rank and re-runs from its input."""
    inputs = Inputs.of(buf, out)
    dst = inputs.dst
    while True:
        try:
            result = comm._all_reduce(buf, op, out)
        except CommError as exc:
            if not shrinkable(exc):
                raise
            answered = shrink_in_place(comm, exc, "all_reduce", dst)
            if answered:
                return dst if out is None else out
            inputs.restore()  # the re-run starts from the input, never a partial sum
            continue
        # for survivors one call behind (an all_reduce: no earlier call is needed again)
        comm._kept.keep(comm._calls.completed, dst, "all_reduce", synced=True)
        return result


def barrier(comm: Communicator) -> None:
    """``comm.barrier`` that shrinks away a dead rank and waits among the survivors."""
    while True:
        try:
            return comm._barrier()
        except CommError as exc:
            if not shrinkable(exc):
                raise
            if shrink_in_place(comm, exc, "barrier", None):
                return None


def shrink_in_place(comm: Communicator, exc: CommError, call: str, dst: np.ndarray | None) -> bool:
    """Shrink ``comm`` to the survivors in place (``call`` was interrupted by ``exc``) and
    bring the ranks one call behind up to date; True if that answered this rank's call."""
    done, kept = comm._calls.completed, comm._kept
    callbacks = comm._shrink_callbacks
    new = comm.shrink(call=call)
    info = new.shrink_info
    become(comm, new)
    if info is None:
        raise CommError(f"rank {comm.rank}: shrink of {comm.id} left no agreement") from exc
    answered = catch_up(comm, info, done, kept, dst)
    for callback in list(callbacks):
        callback(comm, info.excluded)
    return answered


def become(comm: Communicator, new: Communicator) -> None:
    """Make ``comm`` the survivors' communicator ``new`` (its callbacks stay)."""
    callbacks = comm._shrink_callbacks
    vars(comm).update(vars(new))
    comm._shrink_callbacks = callbacks


def catch_up(
    comm: Communicator, info: ShrinkInfo, done: int, kept: Kept, dst: np.ndarray | None
) -> bool:
    """Where the survivors' last completed seqs differ by one, the ranks behind take the
    call's result from the lowest rank ahead (a broadcast on the new communicator, its
    first call); True at a rank behind, whose interrupted call that answers. Anything
    else cannot be made exact: every survivor raises :class:`CommShrunk`."""
    hi, lo = max(info.done.values()), min(info.done.values())
    if hi == lo:
        if info.call[comm.rank] in RERUNS:
            return False
        raise _shrunk(comm, info, f"{info.call[comm.rank] or 'this call'} cannot re-run itself")
    behind = [r for r, d in info.done.items() if d == lo]
    ahead = sorted(r for r, d in info.done.items() if d == hi)
    calls = {info.call[r] for r in behind}
    if hi - lo > 1 or len(calls) != 1 or not calls <= set(RERUNS):
        raise _shrunk(comm, info, f"the survivors stopped at seqs {lo} to {hi}")
    if calls == {"barrier"}:
        return done == lo
    if any(info.kept[r] != hi for r in ahead) or any(info.call[r] not in RERUNS for r in ahead):
        raise _shrunk(comm, info, f"no survivor ahead kept the result of seq {hi}")
    if done == lo:
        assert dst is not None
        comm._broadcast(dst, ahead[0], None)
        return True
    assert kept.result is not None
    target = kept.result if comm.rank == ahead[0] else np.empty_like(kept.result)
    comm._broadcast(target, ahead[0], None)
    return False


def _shrunk(comm: Communicator, info: ShrinkInfo, why: str) -> CommShrunk:
    return CommShrunk(
        f"rank {comm.rank}: {comm.id} shrank to {comm.world_size} ranks without rank(s) "
        f"{','.join(map(str, info.excluded))}; {why}: redo it on the shrunk communicator",
        rank=comm.rank,
        comm=comm.id,
        world_size=comm.world_size,
        excluded=info.excluded,
    )
