"""Pairwise exchange for all-to-all and gathers to one rank.

In step s every rank sends to ``rank+s`` and receives from ``rank-s``, so no link is ever
shared by two transfers in one step.
"""

from __future__ import annotations

from cclctl.runtime.algorithms.context import Array, Step, as_bytes


def all_to_all(ctx: Step, src: Array, out: Array, block: int) -> None:
    """Block ``i`` of ``src`` goes to rank ``i``; block ``i`` of ``out`` comes from rank ``i``.

    ``src`` must not alias ``out`` (the caller copies for in-place calls).
    """
    n, r = ctx.size, ctx.rank
    out[r * block : (r + 1) * block] = src[r * block : (r + 1) * block]
    for s in range(1, n):
        to, frm = (r + s) % n, (r - s) % n
        ctx.xfer(
            s,
            sends=[(to, as_bytes(src[to * block : (to + 1) * block]))],
            recvs=[(frm, as_bytes(out[frm * block : (frm + 1) * block]))],
        )


def gather_chunks(
    ctx: Step, mine: Array, out: Array | None, bounds: list[tuple[int, int]], root: int, step: int
) -> None:
    """Every rank's chunk (``mine``) lands at its place in ``out`` on ``root``."""
    if ctx.rank != root:
        ctx.xfer(step, sends=[(root, as_bytes(mine))])
        return
    assert out is not None
    lo, hi = bounds[root]
    out[lo:hi] = mine
    recvs = [(p, as_bytes(out[a:b])) for p, (a, b) in enumerate(bounds) if p != root]
    ctx.xfer(step, recvs=recvs)
