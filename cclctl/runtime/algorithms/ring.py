"""Ring algorithms: bandwidth-optimal for large messages.

Every rank sends to its right neighbour and receives from its left one, so each link carries
exactly ``(n-1)/n`` of the data per phase. Chunks may differ by one element, so counts that
the world size does not divide need no padding.
"""

from __future__ import annotations

from cclctl.runtime.algorithms.context import (
    RING_INCOMING,
    RING_PARTIAL,
    RING_PARTIAL_NEXT,
    Array,
    Step,
    as_bytes,
    reducer,
)


def reduce_scatter(
    ctx: Step, src: Array, dst: Array, bounds: list[tuple[int, int]], redop: str
) -> int:
    """Reduce ``src`` (one chunk per rank, as ``bounds`` says) so ``dst`` gets chunk ``rank``.

    ``src`` is only read, so it may alias ``dst`` (in place). Partial sums travel in two
    alternating scratch buffers. Returns the number of steps used.
    """
    n, r = ctx.size, ctx.rank
    if n == 1:
        if dst is not src:
            dst[...] = src[bounds[0][0] : bounds[0][1]]
        return 0
    right, left = (r + 1) % n, (r - 1) % n
    fn = reducer(redop)
    width = max(hi - lo for lo, hi in bounds)
    get, dtype = ctx.scratch.get, src.dtype
    bufs = (get(RING_PARTIAL, width, dtype), get(RING_PARTIAL_NEXT, width, dtype))
    recv_buf = get(RING_INCOMING, width, dtype)
    lo, hi = bounds[(r - 1) % n]
    outgoing = src[lo:hi]
    for s in range(n - 1):
        c = (r - s - 2) % n
        lo, hi = bounds[c]
        incoming = recv_buf[: hi - lo]
        ctx.xfer(s, [(right, as_bytes(outgoing))], [(left, as_bytes(incoming))])
        target = dst if s == n - 2 else bufs[s % 2][: hi - lo]
        fn(incoming, src[lo:hi], out=target)
        outgoing = target
    return n - 1


def all_gather(ctx: Step, out: Array, bounds: list[tuple[int, int]], step0: int = 0) -> int:
    """Fill every chunk of ``out`` from the rank that owns it (``out``'s own chunk is set)."""
    n, r = ctx.size, ctx.rank
    right, left = (r + 1) % n, (r - 1) % n
    for s in range(n - 1):
        slo, shi = bounds[(r - s) % n]
        rlo, rhi = bounds[(r - s - 1) % n]
        ctx.xfer(step0 + s, [(right, as_bytes(out[slo:shi]))], [(left, as_bytes(out[rlo:rhi]))])
    return max(n - 1, 0)


def all_reduce(
    ctx: Step, src: Array, out: Array, redop: str, bounds: list[tuple[int, int]]
) -> None:
    """Reduce-scatter then all-gather: 2(n-1)/n of the buffer crosses each link."""
    lo, hi = bounds[ctx.rank]
    steps = reduce_scatter(ctx, src, out[lo:hi], bounds, redop)
    all_gather(ctx, out, bounds, step0=steps)
