"""How a round ends where the ranks of one host work in each other's buffers: the zero-copy
collectives' shared buffers (``zero_copy.py``) and the single-copy collectives' private
arrays reached through the kernel (``single_copy.py``). A rank returns only once its peers
are done with its buffers, because the caller may reuse them then.
"""

from __future__ import annotations

from collections.abc import Sequence

from cclctl.runtime.transport.engines import OneCopy, PeerSlots, Round


def release(g: OneCopy, rnd: Round, readers: Sequence[PeerSlots]) -> None:
    """Say this rank is done with its peers' buffers in ``rnd``, then wait until
    ``readers`` are done with this rank's."""
    g.inputs_read(rnd)
    for view in readers:
        g.await_read(view, rnd)


def shares_written(g: OneCopy, rnd: Round, nbytes: int) -> None:
    """An all_reduce's end, where each rank wrote its reduced share into every rank's
    output: say this rank's share is written, wait for every peer's, release (``nbytes``:
    the call's buffer, for the bytes moved)."""
    g.publish_result(rnd)
    for view in g.others:  # each has written its share into this rank's output
        g.await_result(view, rnd)
    release(g, rnd, g.others)
    g.account(2 * nbytes // g.size)
