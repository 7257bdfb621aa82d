"""The relay's pipeline: device -> staging -> host collective -> staging -> device, by chunk.

Chunk ``k``'s host collective runs while the loads (device -> host copies) of the next
chunks are in flight and the store (host -> device) of the one before drains: a ring of
``depth`` staging buffers lets ``depth - 2`` chunks (at least 1) be loaded ahead, and a
buffer is only loaded again once the store out of it has landed, so nothing waits on a copy
it does not need yet. Each stage is timed: the copier times its copies (on the device
where it is asynchronous) and the host collective is timed around its call.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from cclctl.runtime.relay.copier import CopyEvent
from cclctl.runtime.relay.plans import Chunk
from cclctl.runtime.relay.pool import StagingPool

#: ``host_call(chunk, inp, out)``: the host collective of one chunk on staging views.
HostCall = Callable[[Chunk, np.ndarray, np.ndarray], None]

D2H, COLLECTIVE, H2D = "d2h", "collective", "h2d"
STAGES = (D2H, COLLECTIVE, H2D)


class _Run:
    """One relayed call's state: the copies in flight per chunk and per buffer, and the
    nanoseconds each stage took so far."""

    def __init__(self, pool: StagingPool, src: Any, dst: Any, dtype: np.dtype) -> None:
        self.pool, self.src, self.dst, self.dtype = pool, src, dst, dtype
        self.loading: dict[int, list[CopyEvent]] = {}
        self.storing: list[list[CopyEvent]] = [[] for _ in range(pool.depth)]
        self.ns = dict.fromkeys(STAGES, 0)

    def buffer(self, k: int, chunk: Chunk) -> np.ndarray:
        return self.pool.view(k % self.pool.depth, self.dtype, chunk.used)

    def drain(self, slot: int) -> None:
        """Wait for the stores out of buffer ``slot`` (before it is loaded again)."""
        for event in self.storing[slot]:
            event.wait()
            self.ns[H2D] += event.elapsed_ns()
        self.storing[slot] = []

    def load(self, k: int, chunk: Chunk) -> None:
        self.drain(k % self.pool.depth)
        host = self.buffer(k, chunk)
        to_host = self.pool.copier.to_host
        self.loading[k] = [
            to_host(self.src, p.dev, host[p.host : p.host + p.count]) for p in chunk.loads
        ]

    def loaded(self, k: int) -> None:
        for event in self.loading.pop(k):
            event.wait()
            self.ns[D2H] += event.elapsed_ns()

    def store(self, k: int, chunk: Chunk) -> None:
        host = self.buffer(k, chunk)
        to_device = self.pool.copier.to_device
        self.storing[k % self.pool.depth] = [
            to_device(host[p.host : p.host + p.count], self.dst, p.dev) for p in chunk.stores
        ]


def relay(
    pool: StagingPool,
    src: Any,
    dst: Any,
    dtype: np.dtype,
    chunks: Sequence[Chunk],
    host_call: HostCall,
) -> dict[str, int]:
    """Run ``host_call`` on every chunk of ``src`` staged through ``pool``, its results
    copied into ``dst``; returns the nanoseconds each stage took (:data:`STAGES`).

    Every store has landed when it returns, also when a host call raised (the staging
    buffers are then free for the next call)."""
    run = _Run(pool, src, dst, dtype)
    ahead = max(1, pool.depth - 2)
    try:
        for k in range(min(ahead, len(chunks))):
            run.load(k, chunks[k])
        for k, chunk in enumerate(chunks):
            if k + ahead < len(chunks):
                run.load(k + ahead, chunks[k + ahead])
            run.loaded(k)
            host = run.buffer(k, chunk)
            (i, ni), (o, no) = chunk.inp, chunk.out
            t0 = time.perf_counter_ns()
            host_call(chunk, host[i : i + ni], host[o : o + no])
            run.ns[COLLECTIVE] += time.perf_counter_ns() - t0
            run.store(k, chunk)
    finally:
        for k in list(run.loading):
            run.loaded(k)
        for slot in range(pool.depth):
            run.drain(slot)
    return run.ns
