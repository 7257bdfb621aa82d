"""What re-running a call needs before its first attempt, for a retry and a shrink alike: the
input kept where the call writes over it, the result it returns when a catch-up answered
it, how it ends (a retry's confirm), and how a call whose result differs by rank runs
again for ranks behind.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from cclctl.runtime.comm import buffers
from cclctl.runtime.comm.recovery.call import Call
from cclctl.runtime.comm.recovery.port import Port
from cclctl.runtime.comm.rerun import Ending, Inputs, Replay


@dataclasses.dataclass
class Rerun:
    """A call as a retry or a shrink runs it: ``inputs.dst`` is the result every rank holds
    alike (kept for ranks behind), ``answer`` what the call returns when a catch-up answered
    it; a call whose result differs by rank gives ``replay`` instead (its input is kept, and
    ``replay(input)`` runs it again for ranks behind). ``ending``: how the call ends (its
    attempt calls it; None: it takes none, and keeps its result or input)."""

    call: Call
    inputs: Inputs
    answer: Any
    replay: Replay | None = None
    ending: Ending | None = None


def prepare(port: Port, call: Call) -> Rerun:
    """``call`` as a retry or a shrink re-runs it on ``port``'s communicator (its saved
    input, if any, is lent by ``port.kept``: give it back once the call is over)."""
    op, buf, out = call.op, call.buf, call.out
    if op == "all_reduce":  # checked here, once: its attempts take the views
        buffers.check_redop(call.redop, op)
        src, dst = buffers.reduce_args(buf, out, op)
        inputs = Inputs.of(src, dst, spare=port.kept)
        ending = Ending.of(op, src.nbytes, src.dtype)
        return Rerun(call.with_views(src, dst), inputs, dst if out is None else out, ending=ending)
    if op == "all_gather":  # its input is never written: disjoint, or this rank's slot of out
        assert out is not None
        _, dst, _ = buffers.gather_args(buf, out, port.world_size, port.rank)
        return Rerun(call, Inputs.kept(dst), out, ending=Ending.of(op, dst.nbytes, dst.dtype))
    if op == "broadcast":  # the root's input is only read; the others' is written whole
        root = buffers.check_root(call.root, port.world_size, op)
        _, dst = buffers.in_out(buf, out, op, writable=out is None)
        ending = Ending.of(op, dst.nbytes, dst.dtype)
        answer = dst if out is None else out
        return Rerun(call.with_root(root), Inputs.kept(dst), answer, ending=ending)
    if op == "barrier":
        return Rerun(call, Inputs.kept(np.zeros(1, dtype=np.uint8)), None)
    return _differing(port, call)


def _differing(port: Port, call: Call) -> Rerun:
    """A call whose result differs by rank: its input is kept, and a replay runs it again
    from a copy of it into a buffer that is dropped."""
    op, buf, out = call.op, call.buf, call.out

    def replay(src: np.ndarray) -> object:
        into = np.empty_like(src if op == "reduce" or out is None else out)
        return port.attempt(call.with_buffers(src, into))

    if op == "reduce_scatter":
        assert out is not None
        inputs = Inputs.of(*_flat(call), spare=port.kept)
        ending = Ending.of(op, inputs.src.nbytes, inputs.src.dtype)
        return Rerun(call, inputs, out, replay, ending)
    if op == "reduce":  # kept while the call may write it: its algorithm may stage there
        return Rerun(call, Inputs.of(*_flat(call)), buf if out is None else out, replay)
    if op in ("all_to_all", "all_to_allv"):
        return Rerun(call, Inputs.of(*_flat(call)), out, replay)
    raise ValueError(f"a retry does not re-run {op}")


def _flat(call: Call) -> tuple[np.ndarray, np.ndarray]:
    """``call``'s flat input and output (its input where it has no ``out``), checked as
    arrays its attempts can take; the attempts check the rest."""
    src = buffers.flat(call.buf, "buf", call.op)
    out = call.out
    return src, src if out is None else buffers.flat(out, "out", call.op, writable=True)
