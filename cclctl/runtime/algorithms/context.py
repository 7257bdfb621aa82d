"""What every algorithm needs: the transport, this call, scratch space and reductions."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from cclctl.runtime.transport.base import Exchanger, Transfer, Wait
from cclctl.runtime.transport.wire import Call

Array = np.ndarray

# Scratch buffers by role (the ``slot`` of :meth:`Scratch.get`). Roles that never meet in
# one call share a buffer, so a communicator holds no more scratch than its largest call.
RD_INCOMING = 0  # recursive doubling: the partner's partial result
RING_PARTIAL = 0  # ring reduce-scatter: the running partial sums, alternating with ...
RING_PARTIAL_NEXT = 1  # ... this one
RING_INCOMING = 2  # ring reduce-scatter: the chunk arriving from the left
TREE_INCOMING = 3  # tree reduce: a child's partial result
COPY = 4  # the communicator's copy of an input: reduce's accumulator, in-place all_to_all
SHARE = 5  # reduce by reduce-scatter: this rank's reduced chunk, before it goes to the root
PEER_PIECES = 6  # single-copy: peers' pieces of this rank's share, read through the kernel

_REDUCERS: dict[str, Callable[..., object]] = {
    "sum": np.add,
    "avg": np.add,  # divided by the world size once, at the end
    "prod": np.multiply,
    "min": np.minimum,
    "max": np.maximum,
}


def reducer(op: str) -> Callable[..., object]:
    return _REDUCERS[op]


def finish_avg(arr: Array, world_size: int) -> None:
    """Turn a sum into a mean in place; integers divide truncating toward zero, like C."""
    if arr.dtype.kind == "f" or arr.dtype.name == "bfloat16":
        np.divide(arr, world_size, out=arr, casting="unsafe")
    else:
        sign = np.sign(arr)
        np.abs(arr, out=arr)
        np.floor_divide(arr, world_size, out=arr)
        np.multiply(arr, sign, out=arr)


def as_bytes(arr: Array) -> memoryview:
    """A byte view of a flat contiguous array, for the transport (no copy)."""
    return arr.view(np.uint8).data


def chunk_bounds(count: int, parts: int) -> list[tuple[int, int]]:
    """Split ``count`` elements into ``parts`` nearly equal, contiguous ranges."""
    return [(i * count // parts, (i + 1) * count // parts) for i in range(parts)]


def pieces(count: int, itemsize: int, max_bytes: int, parts: int = 1) -> list[tuple[int, int]]:
    """Split ``count`` elements into contiguous ranges whose ``parts`` together fit in
    ``max_bytes`` (a slot, a piece of cache); at least one range, empty when ``count`` is 0."""
    per = max(1, max_bytes // (itemsize * parts))
    return [(lo, min(count, lo + per)) for lo in range(0, max(count, 1), per)]


class Scratch:
    """Reusable scratch buffers, grown on demand, so a collective allocates nothing."""

    def __init__(self) -> None:
        self._bufs: dict[int, Array] = {}

    def get(self, slot: int, count: int, dtype: np.dtype) -> Array:
        """``count`` elements of ``dtype`` from buffer ``slot`` (a role above), grown as needed."""
        nbytes = count * dtype.itemsize
        buf = self._bufs.get(slot)
        if buf is None or buf.nbytes < nbytes:
            buf = np.empty(max(nbytes, 64), dtype=np.uint8)
            self._bufs[slot] = buf
        return buf[:nbytes].view(dtype)


class Step:
    """One collective call in progress on this rank: who we are and how to move bytes."""

    __slots__ = ("call", "rank", "scratch", "size", "transport", "wait")

    def __init__(
        self, transport: Exchanger, rank: int, size: int, call: Call, wait: Wait, scratch: Scratch
    ) -> None:
        self.transport = transport
        self.rank = rank
        self.size = size
        self.call = call
        self.wait = wait
        self.scratch = scratch

    def xfer(
        self, step: int, sends: Sequence[Transfer] = (), recvs: Sequence[Transfer] = ()
    ) -> None:
        rec = self.wait.record
        if rec is not None:
            rec.step = step
        self.transport.exchange(self.call, step, sends, recvs, self.wait)
