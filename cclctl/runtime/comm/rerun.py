"""What running a collective again needs, for a retry and a shrink alike: the call's input
kept where the call overwrites it, and what completed calls leave for ranks a fault leaves
behind.

A re-run starts from the input, so a partly reduced buffer is never reduced twice. A fault
can leave the ranks calls apart: where every rank's result is alike (all_reduce,
all_gather, broadcast, barrier) the ranks behind take the kept result of each call the
others completed; where it differs by rank (reduce_scatter, reduce, all_to_all) the ranks
ahead run that call once more from a copy of its input, with the ranks behind, and drop
what it gives them (they returned its result already).

How far apart can they be? A call whose result holds every rank's part (:data:`SYNCING`)
tells a rank that completed it that every rank entered it, so none needs an earlier call
again: from there one call is kept, as before. A broadcast or a reduce tells its root
nothing (its sends end in the kernel's buffers), so a run of them can leave ranks any
number of calls apart: each is kept, by seq, up to :data:`KEEP_MAX_BYTES` (beyond the
newest call, always kept); a retry that needs one dropped past that is refused at once.
Each kept call costs one copy, into a buffer a dropped call frees where one fits.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from cclctl.runtime.comm import buffers

#: Runs a completed call again from a copy of its input, its result dropped.
Replay = Callable[[np.ndarray], object]

#: How many bytes of completed calls a communicator keeps for ranks a fault left behind,
#: beyond the newest call (always kept, whatever its size).
KEEP_MAX_BYTES = 128 << 20
#: ... and at most this many calls (a run of tiny broadcasts).
KEEP_MAX_CALLS = 1024
#: The calls whose completion here tells that every rank entered them (every rank's part
#: reached this rank's result), so that no rank needs an earlier call again.
SYNCING = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "barrier")
#: Buffers of dropped calls held for the next ones (a loop's calls reuse them).
_FREE_MAX = 2


@dataclasses.dataclass
class KeptCall:
    """One completed call: its ``seq`` and ``op``, and ``data``: its result where every
    rank holds it alike, else a copy of its input and how to run it again (``replay``)."""

    seq: int
    op: str
    data: np.ndarray
    replay: Replay | None = None

    def run_again(self) -> None:
        """Run the kept call again from its input (the ranks behind re-run it too)."""
        assert self.replay is not None
        self.replay(self.data)


class Kept:
    """What this rank keeps of the communicator's completed calls, by seq: contiguous, from
    :attr:`oldest` to :attr:`seq` (none: both 0)."""

    def __init__(self, max_bytes: int = KEEP_MAX_BYTES, max_calls: int = KEEP_MAX_CALLS) -> None:
        self.max_bytes, self.max_calls = max_bytes, max_calls
        self.calls: dict[int, KeptCall] = {}
        self._bytes = 0
        self._free: list[np.ndarray] = []

    @property
    def seq(self) -> int:
        """The newest kept call's seq (0: none)."""
        return next(reversed(self.calls)) if self.calls else 0

    @property
    def oldest(self) -> int:
        """The oldest kept call's seq (0: none)."""
        return next(iter(self.calls)) if self.calls else 0

    @property
    def result(self) -> np.ndarray | None:
        """The newest call's kept result (None: none, or it kept an input)."""
        last = self.calls.get(self.seq)
        return None if last is None or last.replay is not None else last.data

    def ops(self) -> str:
        """The kept calls' ops, oldest first, comma-separated (what a retry's entry says)."""
        return ",".join(c.op for c in self.calls.values())

    def get(self, seq: int) -> KeptCall | None:
        return self.calls.get(seq)

    def keep(self, seq: int, dst: np.ndarray, op: str = "all_reduce", synced: bool = False) -> None:
        """``dst`` is seq ``seq``'s result, the same on every rank: copy it. ``synced``: the
        call told this rank that every rank entered it (earlier calls are dropped)."""
        self._add(KeptCall(seq, op, dst), synced)

    def keep_input(
        self, seq: int, src: np.ndarray, replay: Replay, op: str = "reduce", synced: bool = False
    ) -> None:
        """Seq ``seq``'s result differs by rank: copy its input ``src``, and ``replay``."""
        self._add(KeptCall(seq, op, src, replay), synced)

    def _add(self, call: KeptCall, synced: bool) -> None:
        if synced or call.seq != self.seq + 1:  # none needs the older ones / not contiguous
            while self.calls:
                self._drop_oldest()
        arr = call.data
        while self.calls and (
            self._bytes + arr.nbytes > self.max_bytes or len(self.calls) >= self.max_calls
        ):
            self._drop_oldest()
        held = self._buffer(arr)
        held[...] = arr
        call.data = held
        self.calls[call.seq] = call
        self._bytes += held.nbytes

    def _drop_oldest(self) -> None:
        dropped = self.calls.pop(self.oldest)
        self._bytes -= dropped.data.nbytes
        if len(self._free) < _FREE_MAX:
            self._free.append(dropped.data)

    def _buffer(self, arr: np.ndarray) -> np.ndarray:
        """A buffer for a copy of ``arr``: a dropped call's where one fits, else new."""
        for i, held in enumerate(self._free):
            if held.shape == arr.shape and held.dtype == arr.dtype:
                return self._free.pop(i)
        return np.empty_like(arr)


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
