"""Run what selection picked: one function per collective maps an algorithm name to its code.

The name is the call's record ``algo`` (see :mod:`~cclctl.runtime.comm.selection`), so what
a record says is what ran. Engines come from the transport's capabilities as selection saw
them; the algorithms themselves never choose.
"""

from __future__ import annotations

from cclctl.runtime.algorithms import hierarchical, latency, pairwise, pipeline, ring, shared
from cclctl.runtime.algorithms.context import COPY, SHARE, Array, Step, chunk_bounds
from cclctl.runtime.transport.capabilities import Capabilities
from cclctl.runtime.transport.engines import HostHierarchy, OneCopy

Bounds = list[tuple[int, int]]


def one_copy(step: Step, caps: Capabilities) -> OneCopy:
    """The one-copy engine in ``caps``. A link dropped since selection saw them (fault
    injection) fails the call: the transport's next step, with nothing to move, says so."""
    if step.transport.capabilities is not caps:
        step.xfer(0)
    group = caps.one_copy
    assert group is not None
    return group


def _hierarchy(caps: Capabilities) -> HostHierarchy:
    assert caps.hierarchy is not None
    return caps.hierarchy


def all_reduce(
    step: Step, algo: str, caps: Capabilities, src: Array, dst: Array, redop: str
) -> None:
    """``dst`` = the reduction of every rank's ``src`` by ``algo`` (``src`` may be ``dst``)."""
    if step.size == 1 or not src.size:
        if dst is not src:
            dst[...] = src
    elif algo == "rd":
        if dst is not src:
            dst[...] = src
        latency.all_reduce(step, dst, redop)
    elif algo == "ring":
        ring.all_reduce(step, src, dst, redop, chunk_bounds(src.size, step.size))
    elif algo == "shm_direct" or algo == "shm_rsag":
        shared.all_reduce(step, one_copy(step, caps), src, dst, redop, rsag=algo == "shm_rsag")
    else:
        large = algo == "hier_ring"
        hierarchical.all_reduce(step, _hierarchy(caps), src, dst, redop, large)


def broadcast(step: Step, algo: str, caps: Capabilities, buf: Array, root: int) -> None:
    """Every rank's ``buf`` = the root's, by ``algo``."""
    if step.size == 1 or not buf.size:
        return
    if algo == "chain":
        pipeline.broadcast(step, buf, root)
    elif algo == "tree":
        latency.broadcast(step, buf, root)
    else:
        shared.broadcast(step, one_copy(step, caps), buf, root)


def reduce(
    step: Step, algo: str, caps: Capabilities, src: Array, dst: Array, redop: str, root: int
) -> None:
    """The root's ``dst`` = the reduction of every rank's ``src``, by ``algo``."""
    if algo == "tree":
        if src.size:
            acc = step.scratch.get(COPY, src.size, src.dtype)
            acc[...] = src
            latency.reduce(step, acc, redop, root)
            if step.rank == root:
                dst[...] = acc
        return
    bounds = chunk_bounds(src.size, step.size)
    lo, hi = bounds[step.rank]
    mine = step.scratch.get(SHARE, hi - lo, src.dtype)
    if algo == "ring":
        steps = ring.reduce_scatter(step, src, mine, bounds, redop)
    else:  # shm_direct: the one-copy reduce-scatter (equal blocks), then the gather
        shared.reduce_scatter(step, one_copy(step, caps), src, mine, bounds, redop)
        steps = 1
    pairwise.gather_chunks(step, mine, dst, bounds, root, steps)


def all_gather(step: Step, algo: str, caps: Capabilities, dst: Array, bounds: Bounds) -> None:
    """Fill every block of ``dst`` from its owner (this rank's block is in place)."""
    if algo == "ring":
        ring.all_gather(step, dst, bounds)
    else:
        shared.all_gather(step, one_copy(step, caps), dst, bounds)


def reduce_scatter(
    step: Step, algo: str, caps: Capabilities, src: Array, dst: Array, bounds: Bounds, redop: str
) -> None:
    """``dst`` = the reduction of block ``rank`` of every rank's ``src`` (equal blocks)."""
    if algo == "ring":
        ring.reduce_scatter(step, src, dst, bounds, redop)
    else:
        shared.reduce_scatter(step, one_copy(step, caps), src, dst, bounds, redop)
