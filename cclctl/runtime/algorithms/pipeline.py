"""Pipelined chain broadcast: for large messages every link carries the buffer once.

The root cuts the buffer into segments and streams them along the ring; each rank forwards
segment j while it receives segment j+1, so the time is about (segments + n - 2) segment
times instead of log2(n) whole-buffer times.
"""

from __future__ import annotations

from cclctl.runtime.algorithms.context import Array, Step, as_bytes, chunk_bounds

SEGMENT_BYTES = 1 << 20


def broadcast(ctx: Step, buf: Array, root: int, segment_bytes: int = SEGMENT_BYTES) -> None:
    n = ctx.size
    if n == 1 or buf.size == 0:
        return
    pos = (ctx.rank - root) % n  # position along the chain; the root is 0
    nseg = max(1, -(-buf.nbytes // segment_bytes))
    segs = chunk_bounds(buf.size, nseg)
    nxt, prev = (ctx.rank + 1) % n, (ctx.rank - 1) % n
    data = buf
    for t in range(nseg + n - 2):
        sends, recvs = [], []
        j_send, j_recv = t - pos, t - pos + 1
        if pos < n - 1 and 0 <= j_send < nseg:
            lo, hi = segs[j_send]
            sends.append((nxt, as_bytes(data[lo:hi])))
        if pos > 0 and 0 <= j_recv < nseg:
            lo, hi = segs[j_recv]
            recvs.append((prev, as_bytes(data[lo:hi])))
        if sends or recvs:
            ctx.xfer(t, sends, recvs)
