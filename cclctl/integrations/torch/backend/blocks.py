"""all_to_all of blocks of any sizes, as torch asks for it: ``all_to_all_single`` with
splits and the list form. The runtime exchanges equal blocks only.

Each rank knows only its own blocks, and whether they are equal on every rank decides
which calls run, so the ranks agree on it first, in one all_reduce ``max`` of two
integers (the largest block and minus the smallest), and then make the same calls
whatever their own blocks (a rank whose splits happen to be equal makes the others'
calls): equal everywhere, one all_to_all on the caller's buffers; else the blocks are
padded to the largest, exchanged in one all_to_all through two buffers kept for the next
call (as large as the largest call's), and unpadded.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import numpy as np

from cclctl.runtime.comm.communicator import Communicator


class BlockExchange:
    """One communicator's exchanges of blocks of any sizes (a process group holds one; its
    calls run one at a time, in issue order)."""

    def __init__(self, comm: Communicator) -> None:
        self.comm = comm
        self._padded: tuple[np.ndarray, np.ndarray] | None = None

    def exchange(
        self,
        outs: Sequence[np.ndarray],
        srcs: Sequence[np.ndarray],
        whole: tuple[np.ndarray, np.ndarray] | None = None,
    ) -> None:
        """Block ``j`` of ``srcs`` goes to rank ``j``; block ``i`` of ``outs`` comes from
        rank ``i``. ``whole``: ``(out, src)``, the flat buffers the blocks are consecutive
        parts of, if they are (``all_to_all_single``), exchanged as they are where every
        rank's blocks are equal."""
        sizes = [b.size for b in (*outs, *srcs)]
        bounds = np.array([max(sizes), -min(sizes)], dtype=np.int64)
        self.comm.all_reduce(bounds, "max")
        block, least = int(bounds[0]), -int(bounds[1])
        if block == least and whole is not None:
            out, src = whole
            self.comm.all_to_all(src, out)
            return
        sent, got = self._buffers(self.comm.world_size * block, srcs[0].dtype)
        for j, part in enumerate(srcs):
            sent[j * block : j * block + part.size] = part
        self.comm.all_to_all(sent, got)
        for i, part in enumerate(outs):
            part[...] = got[i * block : i * block + part.size]

    def _buffers(self, count: int, dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
        """Two buffers of ``count`` elements: views of the last call's where they are large
        enough (their pages touched already; they grow to the largest call's), else new.
        The padding between blocks is never read."""
        kept = self._padded
        if kept is None or kept[0].dtype != dtype or kept[0].size < count:
            kept = self._padded = (np.empty(count, dtype), np.empty(count, dtype))
        return kept[0][:count], kept[1][:count]


def cut(flat: Any, counts: Sequence[int]) -> list[Any]:
    """``flat`` cut into consecutive blocks of ``counts`` elements."""
    return [flat[a:b] for a, b in itertools.pairwise(np.cumsum([0, *counts]).tolist())]
