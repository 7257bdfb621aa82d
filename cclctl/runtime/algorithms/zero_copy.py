"""Zero-copy collectives on shared buffers: ranks read each other's arrays directly.

When every rank of a one-host communicator passes buffers from ``comm.empty()``
(:mod:`cclctl.runtime.transport.shm.shared_buffers`), nothing is staged through the
segment's slots. A rank publishes where its buffers are (one small round: the call's wire
header and the buffer descriptors), then:

- ``all_reduce``: reduces its share of the buffer straight out of every peer's input, in
  rank order (every rank gets the same bits), and writes each piece of the result into
  every rank's output while the piece is still in this core's cache (peers' outputs are
  mapped writable for this). Only this rank reads or writes its share of any buffer, so
  this is safe in place. Each rank moves 2 buffer-lengths of memory, whatever the number
  of ranks (pulling each share back from the rank that reduced it moved 2.5 with 2 ranks
  and 2.75 with 4).
- ``all_gather``: copies each peer's block out of that peer's input (when shared) or
  output.
- ``reduce_scatter``: reduces its block out of every peer's input.
- ``broadcast``: non-roots copy from the root's buffer.

Reductions of more than two inputs run a cache-sized piece at a time, so the partial sum
stays in cache between inputs instead of going to memory and back once per input.

Every call ends when every peer has finished reading this rank's buffers, because the
caller may overwrite them as soon as the call returns. Ranks that disagree about using
shared buffers fail at the first round with a collective mismatch: the wire header marks
calls on shared buffers.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from cclctl.runtime.algorithms.context import Array, Step, chunk_bounds, pieces, reducer
from cclctl.runtime.algorithms.peer_rounds import release, shares_written
from cclctl.runtime.transport.engines import BufferPlan, OneCopy, PeerSlots, Round

#: the record's ``algo`` of a zero-copy call (selection says which calls: ZERO_COPY_FROM
#: in :mod:`cclctl.runtime.comm.selection`)
ALGO = "shm_zero_copy"
#: Bytes of result a reduction of more than two inputs builds at a time: the partial sum
#: and the pieces of every input it reads fit in a core's L2 cache with 4 ranks.
PIECE_BYTES = 256 << 10


def _publish(ctx: Step, g: OneCopy, where: BufferPlan) -> Round:
    """Put this call's header and ``where``'s descriptors in this rank's next slot; return
    the round."""
    payload = where.pack()
    rnd = g.claim_round(ctx.call, ctx.wait, 0, len(payload))
    g.publish_bytes(rnd, payload)
    return rnd


def _peer_arrays(
    g: OneCopy, view: PeerSlots, rnd: Round, dtype: np.dtype, writable: int = 0
) -> list[np.ndarray]:
    """Wait for ``view``'s ``rnd``, check its header and map the buffers it names, the
    last ``writable`` of them writable."""
    mv, peers = g.input_bytes(view, rnd), g.peer_buffers
    size = peers.descriptor_size
    count = rnd.nbytes // size
    return [
        peers.array(bytes(mv[at : at + size]), dtype, view.rank, i >= count - writable)
        for i, at in enumerate(range(0, rnd.nbytes, size))
    ]


def _reduce(
    fn: Callable[..., object], ins: list[Array], me: int, a: int, b: int, out: Array
) -> None:
    """``out`` = the reduction of ``ins[i][a:b]``, this rank's own input first: ``out`` may
    alias it (in place), and it must be read before the first partial result lands there.
    Only this rank reduces this range, so every rank still gets the same bits."""
    if len(ins) == 2:  # one pass: nothing is read back, nothing gained by splitting
        _reduce_piece(fn, ins, me, a, b, out)
        return
    for lo, hi in pieces(b - a, out.itemsize, PIECE_BYTES):
        _reduce_piece(fn, ins, me, a + lo, a + hi, out[lo:hi])


def _reduce_piece(
    fn: Callable[..., object], ins: list[Array], me: int, a: int, b: int, out: Array
) -> None:
    others = ins[:me] + ins[me + 1 :]
    fn(ins[me][a:b], others[0][a:b], out=out)
    for arr in others[1:]:
        fn(out, arr[a:b], out=out)


def all_reduce(
    ctx: Step, g: OneCopy, src: Array, dst: Array, redop: str, where: BufferPlan
) -> None:
    """``dst`` = the reduction of every rank's ``src``; ``where`` locates ``src`` and ``dst``."""
    fn = reducer(redop)
    rnd = _publish(ctx, g, where)
    ins: list[Array] = []
    outs: list[Array] = []
    for view in g.views:
        if view is g.me:
            ins.append(src)
            outs.append(dst)
        else:
            peer_src, peer_dst = _peer_arrays(g, view, rnd, src.dtype, 1)
            ins.append(peer_src)
            outs.append(peer_dst)
    a, b = chunk_bounds(src.size, g.size)[g.local]
    peers_out = [out for i, out in enumerate(outs) if i != g.local]
    for lo, hi in pieces(b - a, src.itemsize, PIECE_BYTES):
        lo, hi = a + lo, a + hi
        piece = dst[lo:hi]
        _reduce_piece(fn, ins, g.local, lo, hi, piece)
        for out in peers_out:  # while the piece is still in this core's cache
            out[lo:hi] = piece
    shares_written(g, rnd, src.nbytes)


def all_gather(
    ctx: Step,
    g: OneCopy,
    out: Array,
    bounds: list[tuple[int, int]],
    where: BufferPlan,
    copy_in: Array | None = None,
) -> None:
    """Fill every block of ``out`` from its owner. ``where`` locates this rank's block: in
    ``out`` already, or in ``copy_in`` (its input), which is copied into ``out`` while the
    peers read it."""
    rnd = _publish(ctx, g, where)
    lo, hi = bounds[g.rank]
    if copy_in is not None:
        out[lo:hi] = copy_in
    for view in g.others:
        (theirs,) = _peer_arrays(g, view, rnd, out.dtype)
        plo, phi = bounds[view.rank]
        out[plo:phi] = theirs
    release(g, rnd, g.others)
    g.account((hi - lo) * out.dtype.itemsize)


def reduce_scatter(
    ctx: Step,
    g: OneCopy,
    src: Array,
    dst: Array,
    bounds: list[tuple[int, int]],
    redop: str,
    where: BufferPlan,
) -> None:
    """``dst`` = the reduction of block ``rank`` of every rank's ``src`` (``where``: its place)."""
    fn = reducer(redop)
    rnd = _publish(ctx, g, where)
    lo, hi = bounds[g.rank]
    ins = [src if view is g.me else _peer_arrays(g, view, rnd, src.dtype)[0] for view in g.views]
    _reduce(fn, ins, g.local, lo, hi, dst)
    release(g, rnd, g.others)
    g.account((hi - lo) * src.dtype.itemsize)


def broadcast(ctx: Step, g: OneCopy, buf: Array, root: int, where: BufferPlan) -> None:
    """Every rank's ``buf`` = the root's, copied straight out of the root's buffer."""
    source = g.views[g.ranks.index(root)]
    if g.rank == root:
        rnd = _publish(ctx, g, where)
        release(g, rnd, g.others)  # the readers: wait until they have their copy
        for view in g.others:
            g.sent[view.rank] += buf.nbytes
        return
    rnd = g.next_round(ctx.call, ctx.wait, 0, g.peer_buffers.descriptor_size)
    (theirs,) = _peer_arrays(g, source, rnd, buf.dtype)
    buf[...] = theirs
    release(g, rnd, [])
    g.received[root] += buf.nbytes
