"""One-copy collectives for ranks that share a host: read and reduce straight from peers.

Each rank copies its input, a chunk at a time, into a slot of its own segment and publishes
the round; peers then reduce or copy directly out of that slot with numpy's ``out=``. A round
is one slot's worth of data; with several slots a fast rank runs ahead while a slow one
still reads, and a slot is reused only once every peer has finished with it.

- ``all_reduce``, small messages (*direct*): every rank reduces every input, in rank
  order, so all ranks get the same bits, in one synchronisation per round.
- ``all_reduce``, large messages (*rsag*): each rank publishes the shares its peers reduce,
  reduces its own share of the round in rank order into its result slot (reduce-scatter),
  then every rank copies every share (all-gather); with 2 ranks each reduces half and
  copies the other half, and memory traffic per rank stays under 3x the buffer whatever
  the rank count.
- ``all_gather``, ``reduce_scatter`` and ``broadcast`` follow the same pattern.

Every published slot carries the wire header of the call (comm, epoch, seq, op, dtype,
count, round), and readers compare it before they touch the data. The rounds, slots and
their counters are the engine's (:class:`~cclctl.runtime.transport.engines.OneCopyEngine`);
this module says only what each collective publishes, reads and reduces.
"""

from __future__ import annotations

from cclctl.runtime.algorithms.context import Array, Step, chunk_bounds, pieces, reducer
from cclctl.runtime.transport.engines import OneCopy, Round


def _publish(ctx: Step, g: OneCopy, src: Array, step: int) -> Round:
    """Copy ``src`` into this rank's next collective slot; return the round."""
    rnd = g.claim_round(ctx.call, ctx.wait, step, src.nbytes)
    g.publish(rnd, src)
    return rnd


def all_reduce(
    ctx: Step, g: OneCopy, src: Array, out: Array, redop: str, rsag: bool = False
) -> None:
    """``out`` = the reduction of every rank's ``src`` (``src`` may be ``out``): *direct*,
    or reduce-scatter + all-gather where selection chose ``rsag`` (3+ ranks, large)."""
    if rsag:
        _all_reduce_rsag(ctx, g, src, out, redop)
    else:
        _all_reduce_direct(ctx, g, src, out, redop)


def _all_reduce_direct(ctx: Step, g: OneCopy, src: Array, out: Array, redop: str) -> None:
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
        rnd = published[step]
        chunks = [g.input_array(v, rnd, dtype) for v in g.views]
        dst = out[lo:hi]
        fn(chunks[0], chunks[1], out=dst)
        for chunk in chunks[2:]:
            fn(dst, chunk, out=dst)
        g.inputs_read(rnd)
        g.account(rnd.nbytes)


def _all_reduce_rsag(ctx: Step, g: OneCopy, src: Array, out: Array, redop: str) -> None:
    """Each rank publishes the shares of the round its peers reduce (not its own: it
    reduces that one straight from ``src``), reduces its share in rank order into its
    result slot, then copies every share into ``out``. With 2 ranks each reduces half and
    copies the other half; every element is reduced by one rank only, so every rank gets
    the same bits."""
    fn = reducer(redop)
    dtype, isz, n = src.dtype, src.dtype.itemsize, g.size
    rec = ctx.wait.record
    for step, (lo, hi) in enumerate(pieces(src.size, isz, g.layout.slot_bytes)):
        if rec is not None:
            rec.step = step
        parts = chunk_bounds(hi - lo, n)
        a, b = parts[g.local]
        rnd = g.claim_round(ctx.call, ctx.wait, step, (hi - lo) * isz)
        g.publish(rnd, src[lo:hi], skip=(a, b))
        own = src[lo + a : lo + b]
        chunks = [own if v is g.me else g.input_array(v, rnd, dtype)[a:b] for v in g.views]
        mine = g.result_array(rnd, a, b, dtype)
        if b > a:
            fn(chunks[0], chunks[1], out=mine)
            for chunk in chunks[2:]:
                fn(mine, chunk, out=mine)
        g.inputs_read(rnd, notify=False)  # the peers learn it with the result, next
        g.publish_result(rnd)
        for view, (pa, pb) in zip(g.views, parts, strict=True):
            share = mine if view is g.me else g.peer_result(view, rnd, pa, pb, dtype)
            if pb > pa:
                out[lo + pa : lo + pb] = share
        g.results_read(rnd)
        g.account(2 * rnd.nbytes // n)


def all_gather(ctx: Step, g: OneCopy, out: Array, bounds: list[tuple[int, int]]) -> None:
    """Fill every rank's block of ``out`` (this rank's block is already in place)."""
    lo0, hi0 = bounds[g.rank]
    dtype, isz = out.dtype, out.dtype.itemsize
    rec = ctx.wait.record
    for step, (lo, hi) in enumerate(pieces(hi0 - lo0, isz, g.layout.slot_bytes)):
        if rec is not None:
            rec.step = step
        rnd = _publish(ctx, g, out[lo0 + lo : lo0 + hi], step)
        for view in g.others:
            base = bounds[view.rank][0]
            out[base + lo : base + hi] = g.input_array(view, rnd, dtype)
        g.inputs_read(rnd)
        g.account((hi - lo) * isz)


def reduce_scatter(
    ctx: Step, g: OneCopy, src: Array, dst: Array, bounds: list[tuple[int, int]], redop: str
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
        rnd = _publish(ctx, g, blocks[:, lo:hi], step)
        a, b = g.local * width, (g.local + 1) * width
        chunks = [g.input_array(v, rnd, dtype)[a:b] for v in g.views]
        part = dst[lo:hi]
        fn(chunks[0], chunks[1], out=part)
        for chunk in chunks[2:]:
            fn(part, chunk, out=part)
        g.inputs_read(rnd)
        g.account(width * isz)


def broadcast(ctx: Step, g: OneCopy, buf: Array, root: int) -> None:
    """Every rank's ``buf`` = the root's (the root's ``buf`` already holds the data)."""
    dtype, isz = buf.dtype, buf.dtype.itemsize
    source = g.views[g.ranks.index(root)]
    rec = ctx.wait.record
    for step, (lo, hi) in enumerate(pieces(buf.size, isz, g.layout.slot_bytes)):
        if rec is not None:
            rec.step = step
        nbytes = (hi - lo) * isz
        if g.rank == root:
            rnd = _publish(ctx, g, buf[lo:hi], step)
            for view in g.others:
                g.sent[view.rank] += nbytes
        else:
            rnd = g.next_round(ctx.call, ctx.wait, step, nbytes)
            buf[lo:hi] = g.input_array(source, rnd, dtype)
            g.received[root] += nbytes
        g.inputs_read(rnd)
