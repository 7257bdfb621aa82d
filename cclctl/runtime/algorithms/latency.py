"""Latency-optimal algorithms for small messages: log2(n) rounds instead of n-1.

Recursive doubling gives every rank bit-identical results: each round combines the same two
partial results on both partners, and the reductions are commutative.
"""

from __future__ import annotations

from cclctl.runtime.algorithms.context import (
    RD_INCOMING,
    TREE_INCOMING,
    Array,
    Step,
    as_bytes,
    reducer,
)


def all_reduce(ctx: Step, out: Array, redop: str) -> None:
    """Recursive doubling on ``out`` in place; non-powers of two fold the extra ranks in."""
    n, r = ctx.size, ctx.rank
    if n == 1:
        return
    fn = reducer(redop)
    tmp = ctx.scratch.get(RD_INCOMING, out.size, out.dtype)
    data, scratch = as_bytes(out), as_bytes(tmp)
    pow2 = 1 << (n.bit_length() - 1)
    extra = n - pow2
    if r < 2 * extra:
        if r % 2 == 0:
            ctx.xfer(0, sends=[(r + 1, data)])
            ctx.xfer(1 + pow2.bit_length(), recvs=[(r + 1, data)])
            return
        ctx.xfer(0, recvs=[(r - 1, scratch)])
        fn(out, tmp, out=out)
        vrank = r // 2
    else:
        vrank = r - extra
    mask, step = 1, 1
    while mask < pow2:
        vpeer = vrank ^ mask
        peer = 2 * vpeer + 1 if vpeer < extra else vpeer + extra
        ctx.xfer(step, sends=[(peer, data)], recvs=[(peer, scratch)])
        fn(out, tmp, out=out)
        mask <<= 1
        step += 1
    if r < 2 * extra:
        ctx.xfer(1 + pow2.bit_length(), sends=[(r - 1, data)])


def broadcast(ctx: Step, buf: Array, root: int) -> None:
    """Binomial tree from ``root``: ceil(log2(n)) rounds."""
    n = ctx.size
    vrank = (ctx.rank - root) % n
    data = as_bytes(buf)
    mask = 1
    while mask < n:
        if vrank & mask:
            ctx.xfer(mask.bit_length(), recvs=[((vrank - mask + root) % n, data)])
            break
        mask <<= 1
    mask >>= 1
    while mask > 0:
        if vrank + mask < n:
            ctx.xfer(mask.bit_length(), sends=[((vrank + mask + root) % n, data)])
        mask >>= 1


def reduce(ctx: Step, acc: Array, redop: str, root: int) -> None:
    """Binomial tree reduction of ``acc`` (a scratch copy) toward ``root``."""
    n = ctx.size
    vrank = (ctx.rank - root) % n
    fn = reducer(redop)
    tmp = ctx.scratch.get(TREE_INCOMING, acc.size, acc.dtype)
    mask = 1
    while mask < n:
        if vrank & mask:
            ctx.xfer(mask.bit_length(), sends=[((vrank - mask + root) % n, as_bytes(acc))])
            return
        if vrank + mask < n:
            ctx.xfer(mask.bit_length(), recvs=[((vrank + mask + root) % n, as_bytes(tmp))])
            fn(acc, tmp, out=acc)
        mask <<= 1
