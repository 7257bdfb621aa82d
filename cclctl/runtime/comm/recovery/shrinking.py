"""``CCLCTL_ON_FAILURE=shrink``: a call that a dead rank interrupted re-runs among the survivors.

The communicator shrinks in place (the same object now runs on the survivors' state, with
new rank numbers and a new comm id: :meth:`~.port.Port.shrink_in_place`), so a training
loop carries on without code changes; callbacks registered with ``comm.on_shrink`` hear of
each shrink, with the ranks it dropped. Which calls re-run, and why the others raise
:class:`~cclctl.errors.CommShrunk`, is :mod:`~.shrink_rules`.

A re-run starts from the call's inputs: a call that writes over its input keeps a copy of
it (only with this policy on), so a partly reduced buffer is never used. A dead rank can
leave the survivors one call apart (some completed seq k, others did not): every survivor
keeps its last call's result (an all_reduce, a broadcast) or input (a reduce), so the
survivors behind take the result from one ahead, or the survivors ahead run the reduce
again with them, and every rank ends up with the same result for every seq.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from cclctl.errors import CommError, CommShrunk
from cclctl.runtime.comm.recovery.call import Call
from cclctl.runtime.comm.recovery.port import Port
from cclctl.runtime.comm.recovery.rerun_inputs import Rerun, prepare
from cclctl.runtime.comm.recovery.shrink_rules import (
    CAUGHT_UP,
    RERUNS,
    SHARED,
    ShrinkInfo,
    shrinkable,
    why_not_rerun,
)
from cclctl.runtime.comm.rerun import Kept, KeptCall


class Shrinking:
    """The shrink policy of one communicator (``port``)."""

    def __init__(self, port: Port) -> None:
        self.port = port
        #: the job's rank of the root of the last kept reduce (its replay's root)
        self._reduce_root = -1

    def run(self, call: Call) -> Any:
        """``call`` until it completes, shrinking away each rank that dies in it; a
        point-to-point call is not re-run (its peer may be the dead rank)."""
        port = self.port
        if call.op in ("send", "recv"):
            return port.attempt(call)
        r = prepare(port, call)
        try:
            while True:
                try:
                    result = port.attempt(r.call)
                except CommError as exc:
                    if not shrinkable(exc):
                        raise
                    answered, r.call = self._shrink(r.call, exc, r.inputs.dst)
                    if answered:  # caught up: an all_reduce, a broadcast or a barrier
                        return r.answer
                    r.inputs.restore()  # the re-run starts from the input, never a partial sum
                    continue
                self._keep(r)
                return result
        finally:
            port.kept.give_back(r.inputs.saved)

    def closing(self) -> None:
        """Nothing to serve: a closing rank's calls are no survivor's to catch up."""

    def _keep(self, r: Rerun) -> None:
        """Keep what survivors one call behind need of this completed call: its result where
        every rank holds it alike, a reduce's input (and its root) to run it again."""
        port, op = self.port, r.call.op
        if op in SHARED:
            port.kept.keep(port.completed, r.inputs.dst, op, synced=True)
        elif op == "reduce":
            inputs, redop = r.inputs, r.call.redop
            src = inputs.src if inputs.saved is None else inputs.saved
            self._reduce_root = port.members[r.call.root]

            def replay(src: np.ndarray) -> object:
                root = port.members.index(self._reduce_root)
                return port.attempt(Call.reduce(src, redop, root, np.empty_like(src)))

            port.kept.keep_input(port.completed, src, replay, op, synced=True)

    def _shrink(self, call: Call, exc: CommError, dst: np.ndarray) -> tuple[bool, Call]:
        """Shrink to the survivors in place (``call`` was interrupted by ``exc``) and bring
        the ranks one call behind up to date; (True if that answered this rank's call, the
        call as it re-runs among the survivors: its root renumbered)."""
        port = self.port
        done, kept, old = port.completed, port.kept, (list(port.members), port.world_size)
        info = port.shrink_in_place(call.op)
        if info is None:
            raise CommError(f"rank {port.rank}: shrink of {port.id} left no agreement") from exc
        answered = self._catch_up(info, done, kept, dst)
        if not answered:
            call = self._among_survivors(call, info, *old)
        port.shrunk(info.excluded)
        return answered, call

    def _among_survivors(self, call: Call, info: ShrinkInfo, members: list[int],
                         size: int) -> Call:  # fmt: skip
        """``call`` as it re-runs among the survivors (the old communicator's ``members``,
        ``size`` ranks): its root renumbered; raises where it cannot re-run."""
        port = self.port
        why = why_not_rerun(info.call[port.rank], size, port.world_size)
        if why:
            raise shrunk(port, info, why)
        if call.op not in ("broadcast", "reduce"):
            return call
        root = members[call.root]  # the job's rank of the old root
        if root not in port.members:
            raise shrunk(port, info, f"the root of its {call.op} (rank {root}) is gone")
        return call.with_root(port.members.index(root))

    def _catch_up(self, info: ShrinkInfo, done: int, kept: Kept, dst: np.ndarray) -> bool:
        """Where the survivors' last completed seqs differ by one, bring the ranks behind up
        to date (on the new communicator, its first call): they take the result of an
        all_reduce or a broadcast from the lowest rank ahead, or the ranks ahead run a
        reduce again with them; True at a rank behind whose interrupted call that answers.
        Anything else cannot be made exact: every survivor raises :class:`CommShrunk`."""
        port = self.port
        hi, lo = max(info.done.values()), min(info.done.values())
        if hi == lo:
            return False
        behind = [r for r, d in info.done.items() if d == lo]
        ahead = sorted(r for r, d in info.done.items() if d == hi)
        calls = {info.call[r] for r in behind}
        if hi - lo > 1 or len(calls) != 1 or not calls <= set(CAUGHT_UP):
            raise shrunk(port, info, f"the survivors stopped at seqs {lo} to {hi}")
        if calls == {"barrier"}:
            return done == lo
        if any(info.kept[r] != hi for r in ahead) or any(info.call[r] not in RERUNS for r in ahead):
            raise shrunk(port, info, f"no survivor ahead kept the result of seq {hi}")
        if calls == {"reduce"}:
            return self._reduce_again(info, done == hi, kept.get(hi))
        if done == lo:
            port.attempt(Call.broadcast(dst, ahead[0]))
            return True
        assert kept.result is not None
        target = kept.result if port.rank == ahead[0] else np.empty_like(kept.result)
        port.attempt(Call.broadcast(target, ahead[0]))
        return False

    def _reduce_again(self, info: ShrinkInfo, ahead: bool, kept: KeptCall | None) -> bool:
        """A reduce that the ranks behind are in: a rank ahead runs it again from its kept
        input among the survivors (its result dropped; the ranks behind re-run theirs), the
        root renumbered; it cannot where the root is gone. Never answers a call."""
        port = self.port
        if not ahead:
            return False
        if self._reduce_root not in port.members:
            why = f"the root of its reduce (rank {self._reduce_root}) is gone"
            raise shrunk(port, info, why)
        assert kept is not None and kept.op == "reduce"
        kept.run_again()
        return False


def shrunk(port: Port, info: ShrinkInfo, why: str) -> CommShrunk:
    """The error of a call that does not re-run after ``port`` shrank (``why``)."""
    return CommShrunk(
        f"rank {port.rank}: {port.id} shrank to {port.world_size} ranks without rank(s) "
        f"{','.join(map(str, info.excluded))}; {why}: redo it on the shrunk communicator",
        rank=port.rank,
        comm=port.id,
        world_size=port.world_size,
        excluded=info.excluded,
    )
