"""What running a collective again needs, for a retry and a shrink alike: the call's input
kept where the call overwrites it, and the last result, for ranks a fault leaves behind.

A re-run starts from the input, so a partly reduced buffer is never reduced twice; a fault
can leave the ranks one call apart, and the ranks behind then take the kept result of the
call the others completed.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from cclctl.runtime.comm import buffers


@dataclasses.dataclass
class Kept:
    """The last result of a communicator's re-run call (every rank holds it alike), and
    its seq."""

    seq: int = 0
    result: np.ndarray | None = None

    def keep(self, seq: int, dst: np.ndarray) -> None:
        """``dst`` is seq ``seq``'s result: copy it (into the last copy, where it fits)."""
        self.seq = seq
        held = self.result
        if held is None or held.shape != dst.shape or held.dtype != dst.dtype:
            self.result = dst.copy()
        else:
            held[...] = dst


@dataclasses.dataclass
class Inputs:
    """An all_reduce's flat input and output, and a copy of the input where the call
    writes over it (in place, or an ``out`` that overlaps it)."""

    src: np.ndarray
    dst: np.ndarray
    saved: np.ndarray | None

    @classmethod
    def of(cls, buf: np.ndarray, out: np.ndarray | None) -> Inputs:
        src = buffers.flat(buf, "buf", "all_reduce")
        dst = src if out is None else buffers.flat(out, "out", "all_reduce", writable=True)
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
