"""all_to_all of blocks of any sizes, as torch asks for it: ``all_to_all_single`` with
splits and the list form, each one ``all_to_allv`` of the runtime.

A rank knows only its own blocks, and the runtime's ``all_to_allv`` needs no more: each
pair's message carries its size, checked against what the receiver expects. So every rank
given splits makes the same one call whatever its blocks (equal here and uneven elsewhere
included), on the caller's buffers where the blocks are consecutive parts of one
(``all_to_all_single``). The list form's blocks are joined into one buffer and the
received ones cut out of another, two buffers kept for the next call (as large as the
largest call's).
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
        self._joined: tuple[np.ndarray, np.ndarray] | None = None

    def exchange(
        self,
        outs: Sequence[np.ndarray],
        srcs: Sequence[np.ndarray],
        whole: tuple[np.ndarray, np.ndarray] | None = None,
    ) -> None:
        """Block ``j`` of ``srcs`` goes to rank ``j``; block ``i`` of ``outs`` comes from
        rank ``i``. ``whole``: ``(out, src)``, the flat buffers the blocks are consecutive
        parts of, if they are (``all_to_all_single``): exchanged as they are."""
        sent = [b.size for b in srcs]
        got = [b.size for b in outs]
        if whole is not None:
            out, src = whole
            self.comm.all_to_allv(src, out, sent, got)
            return
        joined, into = self._buffers(sum(sent), sum(got), srcs[0].dtype)
        np.concatenate(srcs, out=joined)
        self.comm.all_to_allv(joined, into, sent, got)
        for part, block in zip(outs, cut(into, got), strict=True):
            part[...] = block

    def _buffers(self, sent: int, got: int, dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
        """Buffers of ``sent`` and ``got`` elements: views of the last call's where they are
        large enough (their pages touched already; they grow to the largest call's), else
        new."""
        kept = self._joined
        if kept is None or kept[0].dtype != dtype or kept[0].size < sent or kept[1].size < got:
            size = max(sent, got, 0 if kept is None else kept[0].size)
            kept = self._joined = (np.empty(size, dtype), np.empty(size, dtype))
        return kept[0][:sent], kept[1][:got]


def cut(flat: Any, counts: Sequence[int]) -> list[Any]:
    """``flat`` cut into consecutive blocks of ``counts`` elements."""
    return [flat[a:b] for a, b in itertools.pairwise(np.cumsum([0, *counts]).tolist())]
