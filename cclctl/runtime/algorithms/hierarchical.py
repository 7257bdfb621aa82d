"""Hierarchical all-reduce for jobs that span hosts: within each host, across, within again.

The ranks of each host first reduce together through shared memory (one copy, no network),
then one leader per host all-reduces the host sums over TCP (ring for large messages,
recursive doubling for small ones), and each leader broadcasts the result to its host
through shared memory. The network carries each host's data once instead of once per rank.

Where the host's ranks may reach each other's memory (its cross-memory engine), a large
message's host phases are single-copy (``hier_cma``): the leader reduces every local rank's
input straight out of it, the others doing nothing meanwhile, and each of them then copies
the result out of the leader's buffer, one pass each, where the slots' all-reduce has every
rank copy in and reduce, and their broadcast copies in and out again. On a host whose cores
also carry the network's work that is CPU the TCP phase gets back.
"""

from __future__ import annotations

from collections.abc import Sequence

from cclctl.runtime.algorithms import latency, ring, shared, single_copy
from cclctl.runtime.algorithms.context import Array, Step, chunk_bounds
from cclctl.runtime.transport.base import Transfer
from cclctl.runtime.transport.engines import HostHierarchy

#: Steps of the inter-host phase are numbered from here, apart from the intra-host rounds.
CROSS_STEP0 = 1 << 16


class _Leaders(Step):
    """The host leaders as a communicator of their own: virtual ranks map to real ones."""

    __slots__ = ("members",)

    def __init__(self, ctx: Step, members: Sequence[int]) -> None:
        super().__init__(
            ctx.transport, members.index(ctx.rank), len(members), ctx.call, ctx.wait, ctx.scratch
        )
        self.members = list(members)

    def xfer(
        self, step: int, sends: Sequence[Transfer] = (), recvs: Sequence[Transfer] = ()
    ) -> None:
        m = self.members
        super().xfer(
            CROSS_STEP0 + step,
            [(m[p], view) for p, view in sends],
            [(m[p], view) for p, view in recvs],
        )


def all_reduce(
    ctx: Step,
    h: HostHierarchy,
    src: Array,
    out: Array,
    redop: str,
    large: bool,
    single_copy_within: bool = False,
) -> None:
    """``out`` = the reduction of every rank's ``src`` (``src`` may be ``out``);
    ``single_copy_within``: the host's phases through its cross-memory engine."""
    group, cross = h.group, (h.cross_memory if single_copy_within else None)
    assert cross is not None or not single_copy_within or group is None
    if group is None:
        if out is not src:
            out[...] = src
    elif cross is not None:
        single_copy.reduce(ctx, group, cross, src, out, redop, h.leader)
    else:
        shared.all_reduce(ctx, group, src, out, redop, rsag=large and group.size > 2)
    if ctx.rank == h.leader and len(h.leaders) > 1:
        leaders = _Leaders(ctx, h.leaders)
        if large and out.size >= len(h.leaders):
            ring.all_reduce(leaders, out, out, redop, chunk_bounds(out.size, len(h.leaders)))
        else:
            latency.all_reduce(leaders, out, redop)
    if group is not None and cross is not None:
        single_copy.broadcast(ctx, group, cross, out, h.leader)
    elif group is not None:
        shared.broadcast(ctx, group, out, h.leader)
