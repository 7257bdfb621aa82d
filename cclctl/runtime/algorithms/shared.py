"""One-copy collectives for ranks that share a host: read and reduce straight from peers.

Each rank copies its input, a chunk at a time, into a slot of its own segment and publishes
the round; peers then reduce or copy directly out of that slot with numpy's ``out=``. A round
is one slot's worth of data; with several slots a fast rank runs ahead while a slow one
still reads, and a slot is reused only once every peer has finished with it.

- ``all_reduce``, 2 ranks or small messages (*direct*): every rank reduces every input, in
  rank order, so all ranks get the same bits, in one synchronisation per round.
- ``all_reduce``, 3+ ranks and large messages (*rsag*): each rank reduces its share of the
  round into its result slot (reduce-scatter), then every rank copies every share
  (all-gather); memory traffic per rank stays about 3x the buffer whatever the rank count.
- ``all_gather``, ``reduce_scatter`` and ``broadcast`` follow the same pattern.

Every published slot carries the wire header of the call (comm, epoch, seq, op, dtype,
count, round), and readers compare it before they touch the data.
"""

from __future__ import annotations

import numpy as np

from cclctl.runtime.algorithms.context import Array, Step, chunk_bounds, pieces, reducer
from cclctl.runtime.transport import wire
from cclctl.runtime.transport.shm.group import ShmGroup
from cclctl.runtime.transport.shm.layout import (
    HEADER,
    Q_COLL_PUB,
    Q_COLL_USED,
    Q_RES_PUB,
    Q_RES_USED,
    View,
)


def slot_free(ctx: Step, g: ShmGroup, counter: int, k: int, last: int | None = None) -> None:
    """Wait until every peer has finished round ``k - slots`` of ``counter`` (or ``last``,
    the latest earlier round that used this kind of slot, when that is older).
    """
    need = k - g.layout.slots + 1
    if last is not None:
        need = min(need, last + 1)
    if need <= 0:
        return
    for view in g.others:
        if view.q[counter] < need:
            g.wait_counter(view, counter, need, ctx.call, ctx.wait, "recv")


def _publish(ctx: Step, g: ShmGroup, src: Array, step: int) -> tuple[int, int, bytes]:
    """Copy ``src`` into this rank's next collective slot; return (round, offset, header)."""
    k = g.round
    g.round = k + 1
    slot_free(ctx, g, Q_COLL_USED, k)
    off = g.layout.coll_slot(k)
    header = wire.pack(ctx.call, step, src.nbytes)
    me = g.me
    me.mv[off : off + wire.HEADER_SIZE] = header
    if src.nbytes:
        slot = g.slot_array(me, off + HEADER, src.nbytes, src.dtype)
        if src.ndim == 1:
            slot[...] = src
        else:  # reduce_scatter's round: one strided piece of every block
            slot.reshape(src.shape)[...] = src
    me.q[Q_COLL_PUB] = k + 1
    g.notify()
    return k, off, header


def _peer_chunk(
    ctx: Step,
    g: ShmGroup,
    view: View,
    k: int,
    off: int,
    header: bytes,
    step: int,
    nbytes: int,
    dtype: np.dtype,
) -> np.ndarray:
    """Wait for ``view``'s round ``k``; return its slot as ``dtype`` (after the header check)."""
    if view is not g.me:
        await_round(ctx, g, view, k, off, header, step, nbytes)
    return g.slot_array(view, off + HEADER, nbytes, dtype)


def await_round(
    ctx: Step, g: ShmGroup, view: View, k: int, off: int, header: bytes, step: int, nbytes: int
) -> None:
    """Return once peer ``view`` has published round ``k`` at ``off`` and its header there is
    ``header`` (what this rank expects for ``step`` and ``nbytes``); else raise the mismatch."""
    if view.q[Q_COLL_PUB] <= k:
        g.wait_counter(view, Q_COLL_PUB, k + 1, ctx.call, ctx.wait, "recv")
    g.check_header(view, off, header, ctx.call, step, nbytes)


def account(g: ShmGroup, nbytes: int) -> None:
    """Count ``nbytes`` each way between this rank and each peer.

    One-copy rounds are symmetric: what this rank reads from a peer's slot, that peer
    reads from this rank's, so both directions count the same.
    """
    sent, received = g.sent, g.received
    for view in g.others:
        sent[view.rank] += nbytes
        received[view.rank] += nbytes


def _done(g: ShmGroup, counter: int, k: int) -> None:
    g.me.q[counter] = k + 1
    g.notify()


def all_reduce(
    ctx: Step, g: ShmGroup, src: Array, out: Array, redop: str, rsag: bool = False
) -> None:
    """``out`` = the reduction of every rank's ``src`` (``src`` may be ``out``): *direct*,
    or reduce-scatter + all-gather where selection chose ``rsag`` (3+ ranks, large)."""
    if rsag:
        _all_reduce_rsag(ctx, g, src, out, redop)
    else:
        _all_reduce_direct(ctx, g, src, out, redop)


def _all_reduce_direct(ctx: Step, g: ShmGroup, src: Array, out: Array, redop: str) -> None:
    """Publish round j+1 before reducing round j: the copy-in of the next round overlaps
    the wait for a peer that is a little behind, so skew between ranks is not paid twice.
    """
    fn = reducer(redop)
    dtype = src.dtype
    rec = ctx.wait.record
    rounds = pieces(src.size, dtype.itemsize, g.layout.slot_bytes)
    published = [_publish(ctx, g, src[rounds[0][0] : rounds[0][1]], 0)]
    for step, (lo, hi) in enumerate(rounds):
        if step + 1 < len(rounds):
            nlo, nhi = rounds[step + 1]
            published.append(_publish(ctx, g, src[nlo:nhi], step + 1))
        if rec is not None:
            rec.step = step
        k, off, header = published[step]
        nbytes = (hi - lo) * dtype.itemsize
        chunks = [_peer_chunk(ctx, g, v, k, off, header, step, nbytes, dtype) for v in g.views]
        dst = out[lo:hi]
        fn(chunks[0], chunks[1], out=dst)
        for chunk in chunks[2:]:
            fn(dst, chunk, out=dst)
        _done(g, Q_COLL_USED, k)
        account(g, nbytes)


def _all_reduce_rsag(ctx: Step, g: ShmGroup, src: Array, out: Array, redop: str) -> None:
    fn = reducer(redop)
    dtype, isz, n = src.dtype, src.dtype.itemsize, g.size
    rec = ctx.wait.record
    for step, (lo, hi) in enumerate(pieces(src.size, isz, g.layout.slot_bytes)):
        if rec is not None:
            rec.step = step
        k, off, header = _publish(ctx, g, src[lo:hi], step)
        parts = chunk_bounds(hi - lo, n)
        a, b = parts[g.local]
        nbytes = (hi - lo) * isz
        chunks = [_peer_chunk(ctx, g, v, k, off, header, step, nbytes, dtype) for v in g.views]
        slot_free(ctx, g, Q_RES_USED, k, g.last_res_round)
        g.last_res_round = k
        res_off = g.layout.res_slot(k) + HEADER
        mine = g.slot_array(g.me, res_off + a * isz, (b - a) * isz, dtype)
        if b > a:
            fn(chunks[0][a:b], chunks[1][a:b], out=mine)
            for chunk in chunks[2:]:
                fn(mine, chunk[a:b], out=mine)
        g.me.q[Q_COLL_USED] = k + 1
        _done(g, Q_RES_PUB, k)
        for view, (pa, pb) in zip(g.views, parts, strict=True):
            if view.q[Q_RES_PUB] <= k:
                g.wait_counter(view, Q_RES_PUB, k + 1, ctx.call, ctx.wait, "recv")
            if pb > pa:
                share = g.slot_array(view, res_off + pa * isz, (pb - pa) * isz, dtype)
                out[lo + pa : lo + pb] = share
        _done(g, Q_RES_USED, k)
        account(g, 2 * nbytes // n)


def all_gather(ctx: Step, g: ShmGroup, out: Array, bounds: list[tuple[int, int]]) -> None:
    """Fill every rank's block of ``out`` (this rank's block is already in place)."""
    lo0, hi0 = bounds[g.rank]
    dtype, isz = out.dtype, out.dtype.itemsize
    rec = ctx.wait.record
    for step, (lo, hi) in enumerate(pieces(hi0 - lo0, isz, g.layout.slot_bytes)):
        if rec is not None:
            rec.step = step
        k, off, header = _publish(ctx, g, out[lo0 + lo : lo0 + hi], step)
        for view in g.others:
            chunk = _peer_chunk(ctx, g, view, k, off, header, step, (hi - lo) * isz, dtype)
            base = bounds[view.rank][0]
            out[base + lo : base + hi] = chunk
        _done(g, Q_COLL_USED, k)
        account(g, (hi - lo) * isz)


def reduce_scatter(
    ctx: Step, g: ShmGroup, src: Array, dst: Array, bounds: list[tuple[int, int]], redop: str
) -> None:
    """``dst`` = the reduction of block ``rank`` of every rank's ``src`` (equal blocks)."""
    fn = reducer(redop)
    n, dtype, isz = g.size, src.dtype, src.dtype.itemsize
    block = bounds[0][1] - bounds[0][0]
    blocks = src.reshape(n, block)
    rec = ctx.wait.record
    for step, (lo, hi) in enumerate(pieces(block, isz, g.layout.slot_bytes, n)):
        if rec is not None:
            rec.step = step
        width = hi - lo
        k, off, header = _publish(ctx, g, blocks[:, lo:hi], step)
        nbytes = n * width * isz
        a, b = g.local * width, (g.local + 1) * width
        chunks = [_peer_chunk(ctx, g, v, k, off, header, step, nbytes, dtype)[a:b] for v in g.views]
        part = dst[lo:hi]
        fn(chunks[0], chunks[1], out=part)
        for chunk in chunks[2:]:
            fn(part, chunk, out=part)
        _done(g, Q_COLL_USED, k)
        account(g, width * isz)


def broadcast(ctx: Step, g: ShmGroup, buf: Array, root: int) -> None:
    """Every rank's ``buf`` = the root's (the root's ``buf`` already holds the data)."""
    dtype, isz = buf.dtype, buf.dtype.itemsize
    source = g.views[g.ranks.index(root)]
    rec = ctx.wait.record
    for step, (lo, hi) in enumerate(pieces(buf.size, isz, g.layout.slot_bytes)):
        if rec is not None:
            rec.step = step
        if g.rank == root:
            k, _, _ = _publish(ctx, g, buf[lo:hi], step)
            for view in g.others:
                g.sent[view.rank] += (hi - lo) * isz
        else:
            k = g.round
            g.round = k + 1
            off = g.layout.coll_slot(k)
            header = wire.pack(ctx.call, step, (hi - lo) * isz)
            chunk = _peer_chunk(ctx, g, source, k, off, header, step, (hi - lo) * isz, dtype)
            buf[lo:hi] = chunk
            g.received[root] += (hi - lo) * isz
        _done(g, Q_COLL_USED, k)
