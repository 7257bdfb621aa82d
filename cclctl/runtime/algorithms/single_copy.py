"""Single-copy collectives on plain buffers: ranks of one host move bytes straight between
each other's private arrays through the kernel (the transport's
:class:`~cclctl.runtime.transport.engines.CrossMemory`).

The one-copy collectives (``shared.py``) stage every byte through a slot of its sender's
segment, and the reader copies it out again; here a rank publishes only where its arrays
lie (one small round of the one-copy engine: the call's wire header and two addresses),
then:

- ``all_reduce``: reduces its share of the buffer, a cache-sized piece at a time, from its
  own input and every peer's (read into scratch that stays in this core's cache), in rank
  order, and writes each reduced piece into every peer's output while it is still in
  cache. Only this rank reads or writes its share of any buffer, so this is safe in place,
  and every rank gets the same bits (one rank reduces each element). A byte crosses
  between processes in one copy each way, where the slots copy it in and out again.
- ``all_gather``: copies every peer's block out of that peer's output (its own block is
  in place there) straight into this rank's output.
- ``reduce_scatter``: reduces its block from every peer's input, piece by piece.
- ``all_to_allv`` (and ``all_to_all``, its equal blocks): reads its block of every peer's
  input straight into its output, where that peer's published table of blocks says it
  lies (and as long as this rank expects, or the call fails naming both).
- ``reduce`` and ``broadcast`` (the host's phases of the hierarchical all-reduce): the root
  reduces every peer's input into its output; every reader copies the root's buffer.

(A one-host broadcast keeps its slots: see ``SINGLE_COPY_FROM`` in
``runtime/comm/selection.py``.)

Every call ends when every peer has finished with this rank's arrays, because the caller
may reuse them once the call returns.
"""

from __future__ import annotations

from collections.abc import Callable

from cclctl.errors import ProtocolError
from cclctl.runtime.algorithms.context import (
    PEER_PIECES,
    Array,
    Step,
    chunk_bounds,
    pieces,
    reducer,
)
from cclctl.runtime.algorithms.peer_rounds import release, shares_written
from cclctl.runtime.transport.engines import CrossMemory, OneCopy, PeerSlots, Round

#: the record's ``algo`` of a single-copy call (selection's name for it)
ALGO = "shm_cma"
#: Bytes of a piece reduced at a time: the peers' pieces and the result stay in a core's L2
#: cache between the kernel's copy and the reduction (smaller pieces pay more system calls).
PIECE_BYTES = 256 << 10


def _publish(ctx: Step, g: OneCopy, *arrays: Array) -> Round:
    """Put this call's header and where ``arrays`` lie in this rank's next slot."""
    payload = b"".join(a.ctypes.data.to_bytes(8, "little") for a in arrays)
    rnd = g.claim_round(ctx.call, ctx.wait, 0, len(payload))
    g.publish_bytes(rnd, payload)
    return rnd


def _where(g: OneCopy, view: PeerSlots, rnd: Round) -> list[int]:
    """Where ``view``'s arrays lie in its memory, once it published ``rnd`` (checked)."""
    mv = g.input_bytes(view, rnd)
    return [int.from_bytes(mv[at : at + 8], "little") for at in range(0, rnd.nbytes, 8)]


def _reduce(fn: Callable[..., object], ins: list[Array], me: int, out: Array, spare: Array) -> None:
    """``out`` = ``ins`` reduced in rank order (so a ``min`` of signed zeros or NaNs gives
    the bits the other algorithms give). ``ins[me]``, this rank's own, may alias ``out``
    (in place): where it is not among the first two, the first partial result would land
    on it before it is read, so it is copied aside into ``spare`` first."""
    if me >= 2:
        spare[...] = ins[me]
        ins = [*ins[:me], spare, *ins[me + 1 :]]
    fn(ins[0], ins[1], out=out)
    for arr in ins[2:]:
        fn(out, arr, out=out)


def _pieces_of(
    ctx: Step, cm: CrossMemory, peers: list[tuple[int, int]], src: Array, me: int, lo: int,
    hi: int, scratch: Array, width: int,
) -> list[Array]:  # fmt: skip
    """Every rank's input ``[lo, hi)`` in rank order: this rank's ``src``, the peers'
    (at the addresses in ``peers``) read into ``scratch``, ``width`` elements apart."""
    isz, n = src.itemsize, hi - lo
    ins: list[Array] = []
    for i, (peer, where) in enumerate(peers):
        part = scratch[i * width : i * width + n]
        cm.read(peer, where + lo * isz, part, ctx.call)
        ins.append(part)
    ins.insert(me, src[lo:hi])
    return ins


def all_reduce(ctx: Step, g: OneCopy, cm: CrossMemory, src: Array, dst: Array, redop: str) -> None:
    """``dst`` = the reduction of every rank's ``src`` (``src`` may be ``dst``)."""
    fn = reducer(redop)
    rnd = _publish(ctx, g, src, dst)
    where = [(view.rank, *_where(g, view, rnd)) for view in g.others]
    sources = [(peer, peer_src) for peer, peer_src, _ in where]
    a, b = chunk_bounds(src.size, g.size)[g.local]
    isz, call, me = src.itemsize, ctx.call, g.local
    width = max(1, PIECE_BYTES // isz)
    scratch = ctx.scratch.get(PEER_PIECES, width * g.size, src.dtype)
    spare = scratch[width * (g.size - 1) :]
    for lo, hi in pieces(b - a, isz, PIECE_BYTES):
        lo, hi = a + lo, a + hi
        piece = dst[lo:hi]
        ins = _pieces_of(ctx, cm, sources, src, me, lo, hi, scratch, width)
        _reduce(fn, ins, me, piece, spare[: hi - lo])
        for peer, _, peer_dst in where:  # while the piece is still in this core's cache
            cm.write(peer, peer_dst + lo * isz, piece, call)
    shares_written(g, rnd, src.nbytes)


def all_gather(
    ctx: Step, g: OneCopy, cm: CrossMemory, out: Array, bounds: list[tuple[int, int]]
) -> None:
    """Fill every rank's block of ``out`` from that rank's (this rank's is in place)."""
    rnd = _publish(ctx, g, out)
    isz = out.itemsize
    for view in g.others:
        (theirs,) = _where(g, view, rnd)
        lo, hi = bounds[view.rank]
        cm.read(view.rank, theirs + lo * isz, out[lo:hi], ctx.call)
    release(g, rnd, g.others)
    lo, hi = bounds[g.rank]
    g.account((hi - lo) * isz)


def reduce_scatter(
    ctx: Step,
    g: OneCopy,
    cm: CrossMemory,
    src: Array,
    dst: Array,
    bounds: list[tuple[int, int]],
    redop: str,
) -> None:
    """``dst`` = the reduction of block ``rank`` of every rank's ``src`` (equal blocks)."""
    fn = reducer(redop)
    rnd = _publish(ctx, g, src)
    sources = [(view.rank, _where(g, view, rnd)[0]) for view in g.others]
    a, _ = bounds[g.rank]
    width = max(1, PIECE_BYTES // src.itemsize)
    scratch = ctx.scratch.get(PEER_PIECES, width * g.size, src.dtype)
    spare = scratch[width * (g.size - 1) :]
    for lo, hi in pieces(dst.size, src.itemsize, PIECE_BYTES):
        ins = _pieces_of(ctx, cm, sources, src, g.local, a + lo, a + hi, scratch, width)
        _reduce(fn, ins, g.local, dst[lo:hi], spare[: hi - lo])
    release(g, rnd, g.others)
    g.account(dst.nbytes)


def reduce(
    ctx: Step, g: OneCopy, cm: CrossMemory, src: Array, out: Array, redop: str, root: int
) -> None:
    """The root's ``out`` = the reduction of every rank's ``src``, in rank order, read
    piece by piece out of each peer's; the others' ``out`` is not written."""
    rnd = _publish(ctx, g, src)
    if g.rank != root:
        release(g, rnd, [g.views[g.ranks.index(root)]])  # until the root has read it
        g.sent[root] += src.nbytes
        return
    fn = reducer(redop)
    sources = [(view.rank, _where(g, view, rnd)[0]) for view in g.others]
    width = max(1, PIECE_BYTES // src.itemsize)
    scratch = ctx.scratch.get(PEER_PIECES, width * g.size, src.dtype)
    spare = scratch[width * (g.size - 1) :]
    for lo, hi in pieces(src.size, src.itemsize, PIECE_BYTES):
        ins = _pieces_of(ctx, cm, sources, src, g.local, lo, hi, scratch, width)
        _reduce(fn, ins, g.local, out[lo:hi], spare[: hi - lo])
    release(g, rnd, [])
    for view in g.others:
        g.received[view.rank] += src.nbytes


def broadcast(ctx: Step, g: OneCopy, cm: CrossMemory, buf: Array, root: int) -> None:
    """Every rank's ``buf`` = the root's, each reader copying it straight out of the
    root's buffer."""
    if g.rank == root:
        rnd = _publish(ctx, g, buf)
        release(g, rnd, g.others)  # the readers: wait until they have their copy
        for view in g.others:
            g.sent[view.rank] += buf.nbytes
        return
    source = g.views[g.ranks.index(root)]
    rnd = g.next_round(ctx.call, ctx.wait, 0, 8)
    (theirs,) = _where(g, source, rnd)
    cm.read(root, theirs, buf, ctx.call)
    release(g, rnd, [])
    g.received[root] += buf.nbytes


def all_to_all(ctx: Step, g: OneCopy, cm: CrossMemory, src: Array, out: Array, block: int) -> None:
    """Block ``i`` of ``out`` = block ``rank`` of rank ``i``'s ``src``, read straight out of
    it: :func:`all_to_allv` of equal blocks. ``src`` must not alias ``out`` (the caller
    copies for in-place calls): a peer reads this rank's ``src`` while this rank writes its
    ``out``."""
    blocks = [(i * block, (i + 1) * block) for i in range(ctx.size)]
    all_to_allv(ctx, g, cm, src, out, blocks, blocks)


def all_to_allv(
    ctx: Step,
    g: OneCopy,
    cm: CrossMemory,
    src: Array,
    out: Array,
    sends: list[tuple[int, int]],
    recvs: list[tuple[int, int]],
) -> None:
    """``out[recvs[i]]`` = rank ``i``'s block for this rank, read straight out of its
    ``src`` (``sends``/``recvs``: ``(start, stop)`` in elements, per rank). Each rank
    publishes its ``src``'s address and its table of blocks, so a reader finds its block
    where the peer cut it, and a peer's block of another size than this rank expects
    fails the call naming both, before anything is read."""
    table = [src.ctypes.data, *(x for a, b in sends for x in (a, b - a))]
    payload = b"".join(v.to_bytes(8, "little") for v in table)
    rnd = g.claim_round(ctx.call, ctx.wait, 0, len(payload))
    g.publish_bytes(rnd, payload)
    me, isz = g.rank, src.itemsize
    (a, b), (c, d) = sends[me], recvs[me]
    out[c:d] = src[a:b]  # the caller checked these sizes agree
    for view in g.others:
        theirs = _where(g, view, rnd)
        start, count = theirs[1 + 2 * me], theirs[2 + 2 * me]
        c, d = recvs[view.rank]
        if count != d - c:
            what = ctx.call.what()
            raise ProtocolError(
                f"collective mismatch: rank {me} expects {d - c} elements from rank "
                f"{view.rank} in {ctx.call.describe()}, but rank {view.rank} sends {count}",
                rank=me, peer=view.rank, seq=ctx.call.seq, op=ctx.call.op,
                mine=f"{what} expecting {d - c} elements from it",
                theirs=f"{what} sending {count} elements to rank {me}",
                fault="step_mismatch",
            )  # fmt: skip
        if count:
            cm.read(view.rank, theirs[0] + start * isz, out[c:d], ctx.call)
    release(g, rnd, g.others)
    for view in g.others:
        g.sent[view.rank] += (sends[view.rank][1] - sends[view.rank][0]) * isz
        g.received[view.rank] += (recvs[view.rank][1] - recvs[view.rank][0]) * isz
