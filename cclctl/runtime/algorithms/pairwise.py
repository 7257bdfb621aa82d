"""Pairwise exchange for all-to-all (of equal blocks, or of any sizes) and gathers to one rank.

In step s every rank sends to ``rank+s`` and receives from ``rank-s``, so no link is ever
shared by two transfers in one step.
"""

from __future__ import annotations

from cclctl.runtime.algorithms.context import Array, Step, as_bytes

#: ``(start, stop)`` of each rank's block, in elements.
Bounds = list[tuple[int, int]]


def all_to_all(ctx: Step, src: Array, out: Array, block: int) -> None:
    """Block ``i`` of ``src`` goes to rank ``i``; block ``i`` of ``out`` comes from rank ``i``.

    ``src`` must not alias ``out`` (the caller copies for in-place calls).
    """
    blocks = [(i * block, (i + 1) * block) for i in range(ctx.size)]
    all_to_allv(ctx, src, out, blocks, blocks)


def all_to_allv(ctx: Step, src: Array, out: Array, sends: Bounds, recvs: Bounds) -> None:
    """``src[sends[i]]`` goes to rank ``i``; ``out[recvs[i]]`` comes from rank ``i``
    (``(start, stop)`` each, in elements; ``src`` apart from ``out``).

    Every pair exchanges a message in its step, an empty one included, so a block's size
    that the two ranks of a pair disagree on fails the call naming both (the receiver
    checks the message's size), where skipping empty blocks would leave one of them
    waiting."""
    n, r = ctx.size, ctx.rank
    (a, b), (c, d) = sends[r], recvs[r]
    out[c:d] = src[a:b]  # the caller checked these sizes agree
    for s in range(1, n):
        to, frm = (r + s) % n, (r - s) % n
        (a, b), (c, d) = sends[to], recvs[frm]
        ctx.xfer(s, sends=[(to, as_bytes(src[a:b]))], recvs=[(frm, as_bytes(out[c:d]))])


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
