"""Run what selection picked: one table per collective maps an algorithm name to its code.

The name is the call's record ``algo`` (see :mod:`~cclctl.runtime.comm.selection`), so what
a record says is what ran; a name a table lacks raises :class:`UnknownAlgorithm` before
anything moves. Engines come from the transport's capabilities as selection saw them; the
algorithms themselves never choose.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import NoReturn

from cclctl.runtime.algorithms import (
    hierarchical,
    latency,
    pairwise,
    pipeline,
    ring,
    shared,
    single_copy,
)
from cclctl.runtime.algorithms.context import COPY, SHARE, Array, Step, chunk_bounds
from cclctl.runtime.transport.capabilities import Capabilities
from cclctl.runtime.transport.engines import CrossMemory, HostHierarchy, OneCopy

Bounds = list[tuple[int, int]]


class UnknownAlgorithm(LookupError):
    """Selection named an algorithm the op's dispatch table does not have."""


def _unknown(table: Mapping[str, object], op: str, algo: str) -> NoReturn:
    """Raise for an ``algo`` that ``table`` lacks (looked up inline: every call looks)."""
    known = ", ".join(sorted(table))
    raise UnknownAlgorithm(f"{op} has no algorithm {algo!r} (it has {known})")


def one_copy(step: Step, caps: Capabilities) -> OneCopy:
    """The one-copy engine in ``caps``. A link dropped since selection saw them (fault
    injection) fails the call: the transport's next step, with nothing to move, says so."""
    if step.transport.capabilities is not caps:
        step.xfer(0)
    group = caps.one_copy
    assert group is not None
    return group


def cross_memory(caps: Capabilities) -> CrossMemory:
    """The cross-memory engine in ``caps`` (selection picks single-copy only where it is)."""
    assert caps.cross_memory is not None
    return caps.cross_memory


def _hierarchy(caps: Capabilities) -> HostHierarchy:
    assert caps.hierarchy is not None
    return caps.hierarchy


# ------------------------------------------------------------------ all_reduce
AllReduce = Callable[[Step, Capabilities, Array, Array, str], None]


def _all_reduce_rd(step: Step, caps: Capabilities, src: Array, dst: Array, redop: str) -> None:
    if dst is not src:
        dst[...] = src
    latency.all_reduce(step, dst, redop)


def _all_reduce_ring(step: Step, caps: Capabilities, src: Array, dst: Array, redop: str) -> None:
    ring.all_reduce(step, src, dst, redop, chunk_bounds(src.size, step.size))


def _one_copy_all_reduce(rsag: bool) -> AllReduce:
    def run(step: Step, caps: Capabilities, src: Array, dst: Array, redop: str) -> None:
        shared.all_reduce(step, one_copy(step, caps), src, dst, redop, rsag=rsag)

    return run


def _single_copy_all_reduce(
    step: Step, caps: Capabilities, src: Array, dst: Array, redop: str
) -> None:
    group = one_copy(step, caps)
    single_copy.all_reduce(step, group, cross_memory(caps), src, dst, redop)


def _hierarchical_all_reduce(large: bool, single_copy_within: bool = False) -> AllReduce:
    def run(step: Step, caps: Capabilities, src: Array, dst: Array, redop: str) -> None:
        h = _hierarchy(caps)
        hierarchical.all_reduce(step, h, src, dst, redop, large, single_copy_within)

    return run


_ALL_REDUCE: dict[str, AllReduce] = {
    "rd": _all_reduce_rd,
    "ring": _all_reduce_ring,
    "shm_direct": _one_copy_all_reduce(rsag=False),
    "shm_rsag": _one_copy_all_reduce(rsag=True),
    single_copy.ALGO: _single_copy_all_reduce,
    "hier_rd": _hierarchical_all_reduce(large=False),
    "hier_ring": _hierarchical_all_reduce(large=True),
    "hier_cma": _hierarchical_all_reduce(large=True, single_copy_within=True),
}


def all_reduce(
    step: Step, algo: str, caps: Capabilities, src: Array, dst: Array, redop: str
) -> None:
    """``dst`` = the reduction of every rank's ``src`` by ``algo`` (``src`` may be ``dst``)."""
    run = _ALL_REDUCE.get(algo) or _unknown(_ALL_REDUCE, "all_reduce", algo)
    if step.size == 1 or not src.size:
        if dst is not src:
            dst[...] = src
        return
    run(step, caps, src, dst, redop)


# ------------------------------------------------------------------ broadcast
Broadcast = Callable[[Step, Capabilities, Array, int], None]
_BROADCAST: dict[str, Broadcast] = {
    "chain": lambda step, caps, buf, root: pipeline.broadcast(step, buf, root),
    "tree": lambda step, caps, buf, root: latency.broadcast(step, buf, root),
    "shm_direct": lambda step, caps, buf, root: shared.broadcast(
        step, one_copy(step, caps), buf, root
    ),
}


def broadcast(step: Step, algo: str, caps: Capabilities, buf: Array, root: int) -> None:
    """Every rank's ``buf`` = the root's, by ``algo``."""
    run = _BROADCAST.get(algo) or _unknown(_BROADCAST, "broadcast", algo)
    if step.size == 1 or not buf.size:
        return
    run(step, caps, buf, root)


# ------------------------------------------------------------------ reduce
#: a reduce by reduce-scatter: this rank's reduced share of ``src``; the steps it took
ScatterShare = Callable[[Step, Capabilities, Array, Array, Bounds, str], int]


def _ring_share(
    step: Step, caps: Capabilities, src: Array, mine: Array, bounds: Bounds, redop: str
) -> int:
    return ring.reduce_scatter(step, src, mine, bounds, redop)


def _one_copy_share(
    step: Step, caps: Capabilities, src: Array, mine: Array, bounds: Bounds, redop: str
) -> int:
    """The one-copy reduce-scatter (equal blocks): one step."""
    shared.reduce_scatter(step, one_copy(step, caps), src, mine, bounds, redop)
    return 1


#: ``tree`` reduces to the root directly; the others reduce-scatter, then gather there
_REDUCE_SHARES: dict[str, ScatterShare | None] = {
    "tree": None,
    "ring": _ring_share,
    "shm_direct": _one_copy_share,
}


def reduce(
    step: Step, algo: str, caps: Capabilities, src: Array, dst: Array, redop: str, root: int
) -> None:
    """The root's ``dst`` = the reduction of every rank's ``src``, by ``algo``."""
    if algo not in _REDUCE_SHARES:  # its entries may be None
        _unknown(_REDUCE_SHARES, "reduce", algo)
    share = _REDUCE_SHARES[algo]
    if share is None:
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
    steps = share(step, caps, src, mine, bounds, redop)
    pairwise.gather_chunks(step, mine, dst, bounds, root, steps)


# ------------------------------------------------------------------ all_gather, reduce_scatter
AllGather = Callable[[Step, Capabilities, Array, Bounds], object]
_ALL_GATHER: dict[str, AllGather] = {
    "ring": lambda step, caps, dst, bounds: ring.all_gather(step, dst, bounds),
    "shm_direct": lambda step, caps, dst, bounds: shared.all_gather(
        step, one_copy(step, caps), dst, bounds
    ),
    single_copy.ALGO: lambda step, caps, dst, bounds: single_copy.all_gather(
        step, one_copy(step, caps), cross_memory(caps), dst, bounds
    ),
}


def all_gather(step: Step, algo: str, caps: Capabilities, dst: Array, bounds: Bounds) -> None:
    """Fill every block of ``dst`` from its owner (this rank's block is in place)."""
    run = _ALL_GATHER.get(algo) or _unknown(_ALL_GATHER, "all_gather", algo)
    run(step, caps, dst, bounds)


ReduceScatter = Callable[[Step, Capabilities, Array, Array, Bounds, str], object]
_REDUCE_SCATTER: dict[str, ReduceScatter] = {
    "ring": lambda step, caps, src, dst, bounds, redop: ring.reduce_scatter(
        step, src, dst, bounds, redop
    ),
    "shm_direct": lambda step, caps, src, dst, bounds, redop: shared.reduce_scatter(
        step, one_copy(step, caps), src, dst, bounds, redop
    ),
    single_copy.ALGO: lambda step, caps, src, dst, bounds, redop: single_copy.reduce_scatter(
        step, one_copy(step, caps), cross_memory(caps), src, dst, bounds, redop
    ),
}


def reduce_scatter(
    step: Step, algo: str, caps: Capabilities, src: Array, dst: Array, bounds: Bounds, redop: str
) -> None:
    """``dst`` = the reduction of block ``rank`` of every rank's ``src`` (equal blocks)."""
    run = _REDUCE_SCATTER.get(algo) or _unknown(_REDUCE_SCATTER, "reduce_scatter", algo)
    run(step, caps, src, dst, bounds, redop)


# ------------------------------------------------------------------ all_to_all
AllToAll = Callable[[Step, Capabilities, Array, Array, int], object]
_ALL_TO_ALL: dict[str, AllToAll] = {
    "pairwise": lambda step, caps, src, dst, block: pairwise.all_to_all(step, src, dst, block),
    single_copy.ALGO: lambda step, caps, src, dst, block: single_copy.all_to_all(
        step, one_copy(step, caps), cross_memory(caps), src, dst, block
    ),
}


def all_to_all(
    step: Step, algo: str, caps: Capabilities, src: Array, dst: Array, block: int
) -> None:
    """Block ``i`` of ``dst`` = block ``rank`` of rank ``i``'s ``src`` (apart from ``dst``)."""
    run = _ALL_TO_ALL.get(algo) or _unknown(_ALL_TO_ALL, "all_to_all", algo)
    run(step, caps, src, dst, block)


# ------------------------------------------------------------------ all_to_allv
AllToAllV = Callable[[Step, Capabilities, Array, Array, Bounds, Bounds], object]
_ALL_TO_ALLV: dict[str, AllToAllV] = {
    "pairwise": lambda step, caps, src, dst, sends, recvs: pairwise.all_to_allv(
        step, src, dst, sends, recvs
    ),
    single_copy.ALGO: lambda step, caps, src, dst, sends, recvs: single_copy.all_to_allv(
        step, one_copy(step, caps), cross_memory(caps), src, dst, sends, recvs
    ),
}


def all_to_allv(
    step: Step, algo: str, caps: Capabilities, src: Array, dst: Array, sends: Bounds, recvs: Bounds
) -> None:
    """``dst[recvs[i]]`` = rank ``i``'s ``src[sends[rank]]`` (``src`` apart from ``dst``)."""
    run = _ALL_TO_ALLV.get(algo) or _unknown(_ALL_TO_ALLV, "all_to_allv", algo)
    run(step, caps, src, dst, sends, recvs)
