"""A retry's catch-up: the seqs some ranks completed and others did not, run again together.

After the agreement (:mod:`~.retry_rules`), a rank ahead serves each seq the plan names
from what it kept (:class:`~cclctl.runtime.comm.rerun.Kept`), with the ranks behind, on
the renewed links; a seq that ended with a confirm (:data:`~.retry_rules.HELD`) moves
nothing and is closed on every rank with a record of its own. :mod:`~.retrying` drives it.
"""

from __future__ import annotations

import numpy as np

from cclctl.runtime.comm.recovery.call import Call
from cclctl.runtime.comm.recovery.port import Port
from cclctl.runtime.comm.recovery.retry_rules import HELD, HELD_ALGO, REPLAY, Plan
from cclctl.runtime.comm.rerun import Form


def serve(port: Port, plan: Plan, stop: int) -> None:
    """Run each catch-up seq below ``stop`` (those this rank completed and a rank behind
    did not) with the ranks behind, from what this rank kept: a broadcast of the kept
    result (from the plan's root, the others dropping what they receive), or the call
    again from its kept input; nothing for a call that ended with a confirm."""
    for seq in range(plan.seq, stop):
        kept, root = port.kept.get(seq), plan.step(seq)
        assert kept is not None and root is not None  # the plan checked every rank keeps it
        if root == HELD:
            close_held(port, kept.op, kept.form)
            continue
        assert kept.data is not None
        if root == REPLAY:
            kept.run_again()
        elif root == port.rank:
            port.attempt(Call.broadcast(kept.data, root))
        else:
            port.attempt(Call.broadcast(np.empty_like(kept.data), root))


def close_held(port: Port, call: str, form: Form | None) -> None:
    """Close the :data:`~.retry_rules.HELD` seq the calls are at, here, with a record of
    its own (of the call's ``form``, as every rank's first one said): every rank's seqs
    stay aligned, and the diagnosis sees it completed in the new epoch."""
    dtype, count, nbytes = (np.dtype(np.uint8), 0, 0) if form is None else form
    with port.record(call, np.empty(0, dtype), HELD_ALGO, count=count, nbytes=nbytes):
        pass
