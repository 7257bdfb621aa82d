"""What running a collective again needs, for a retry and a shrink alike: the call's input
kept where the call overwrites it, and what the last call leaves for ranks a fault leaves
behind.

A re-run starts from the input, so a partly reduced buffer is never reduced twice; a fault
can leave the ranks one call apart. Where every rank's result is alike (all_reduce,
all_gather, broadcast, barrier) the ranks behind take the kept result of the call the
others completed; where it differs by rank (reduce_scatter, reduce, all_to_all) the ranks
ahead run that call once more from a copy of its input, with the ranks behind, and drop
what it gives them (they returned its result already).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from cclctl.runtime.comm import buffers

#: Runs a completed call again from a copy of its input, its result dropped.
Replay = Callable[[np.ndarray], object]


def _copy_into(held: np.ndarray | None, arr: np.ndarray) -> np.ndarray:
    """A copy of ``arr``: into ``held`` where it fits (no allocation per call), else new."""
    if held is None or held.shape != arr.shape or held.dtype != arr.dtype:
        return arr.copy()
    held[...] = arr
    return held


@dataclasses.dataclass
class Kept:
    """What the communicator's last re-run call left, and its seq: its result where every
    rank holds it alike, else a copy of its input and how to run it again."""

    seq: int = 0
    result: np.ndarray | None = None
    input: np.ndarray | None = None
    replay: Replay | None = None

    def keep(self, seq: int, dst: np.ndarray) -> None:
        """``dst`` is seq ``seq``'s result, the same on every rank: copy it."""
        self.seq, self.replay = seq, None
        self.result = _copy_into(self.result, dst)

    def keep_input(self, seq: int, src: np.ndarray, replay: Replay) -> None:
        """Seq ``seq``'s result differs by rank: copy its input ``src``, and ``replay``."""
        self.seq, self.replay = seq, replay
        self.input = _copy_into(self.input, src)

    def run_again(self) -> None:
        """Run the kept call again from its input (the ranks behind re-run it too)."""
        assert self.replay is not None and self.input is not None
        self.replay(self.input)


@dataclasses.dataclass
class Inputs:
    """A call's flat input and output, and a copy of the input where the call writes over
    it (in place, or an ``out`` that overlaps it)."""

    src: np.ndarray
    dst: np.ndarray
    saved: np.ndarray | None

    @classmethod
    def of(cls, buf: np.ndarray, out: np.ndarray | None, op: str = "all_reduce") -> Inputs:
        src = buffers.flat(buf, "buf", op)
        dst = src if out is None else buffers.flat(out, "out", op, writable=True)
        saved = src.copy() if dst is src or buffers.overlaps(src, dst) else None
        return cls(src, dst, saved)

    @classmethod
    def kept(cls, dst: np.ndarray) -> Inputs:
        """A call whose input is never written (only its result ``dst`` is)."""
        return cls(dst, dst, None)

    def restore(self) -> None:
        """The input again, for the next attempt."""
        if self.saved is not None:
            self.src[...] = self.saved
