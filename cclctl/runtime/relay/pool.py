"""The relay's staging memory: a fixed ring of ``depth`` buffers of ``chunk_bytes`` each.

Every buffer is made once, on first use, by the copier (page-locked host memory where the
device supports it) and reused by every later call, so staging never holds more than
``depth * chunk_bytes`` bytes however large the tensors are (:attr:`allocated_bytes`
says how much it holds).
"""

from __future__ import annotations

import numpy as np

from cclctl.runtime.relay.copier import Copier


class StagingPool:
    """``depth`` staging buffers of ``chunk_bytes`` bytes, made by ``copier`` on demand."""

    def __init__(self, copier: Copier, chunk_bytes: int, depth: int) -> None:
        if depth < 2:
            raise ValueError(f"a staging ring needs at least 2 buffers, not {depth}")
        if chunk_bytes < 64:
            raise ValueError(f"a staging buffer of {chunk_bytes} bytes is too small")
        self.copier = copier
        self.chunk_bytes = chunk_bytes
        self.depth = depth
        self._buffers: list[np.ndarray | None] = [None] * depth

    @property
    def allocated_bytes(self) -> int:
        """Bytes of staging memory made so far (never over ``depth * chunk_bytes``)."""
        return sum(b.nbytes for b in self._buffers if b is not None)

    def elements(self, dtype: np.dtype) -> int:
        """How many elements of ``dtype`` one buffer holds."""
        return self.chunk_bytes // dtype.itemsize

    def view(self, slot: int, dtype: np.dtype, count: int) -> np.ndarray:
        """The first ``count`` elements of buffer ``slot`` as ``dtype``."""
        buf = self._buffers[slot]
        if buf is None:
            buf = self._buffers[slot] = self.copier.staging(self.chunk_bytes)
        return buf[: count * dtype.itemsize].view(dtype)
