"""A rank of a retry job whose links are cut at a chosen step of a chosen call.

``CALLS`` names the calls in order (seq ``i + 1`` is the ``i``-th): ``sum`` (an in-place
all_reduce), ``gather`` (an all_gather out of place), ``bcast`` (an in-place broadcast
from rank 0) and ``scatter`` (a reduce_scatter out of place), each of ``COUNT`` float32
elements (:func:`call_input`: random, so a sum's bits depend on its order). ``CUTS`` is a
``;``-separated list of ``rank:seq:step:peer:how``: the first time rank ``rank`` exchanges
at step ``step`` of seq ``seq``, it closes its link to ``peer`` (``how`` = ``cut``: before
the exchange, which then fails), or makes the exchange without its sends and then closes
the link (``lose``: its message is lost on the way, though the rank got the peer's, as a
last message can be). Each rank prints ``result <seq> <sha256 of its result>`` after each
call, ``epoch <n>`` and ``done`` at the end.
"""

from __future__ import annotations

import hashlib
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

import cclctl
from cclctl.runtime.algorithms.context import Step

COUNT = int(os.environ.get("COUNT", str(1 << 19)))


def call_input(seq: int, rank: int, count: int) -> np.ndarray:
    """Rank ``rank``'s input to seq ``seq``: random float32 (no sum of them is exact)."""
    return np.random.default_rng([seq, rank]).standard_normal(count).astype(np.float32)


def digest(a: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()


def _cutting(rank: int, plan: str) -> None:
    """Wrap every step's exchange (whatever transport a retry renewed) to carry out this
    rank's cuts of ``plan``, each once."""
    cuts = {}
    for item in filter(None, plan.split(";")):
        r, seq, step, peer, how = item.split(":")
        if int(r) == rank:
            cuts[(int(seq), int(step))] = (int(peer), how)
    xfer = Step.xfer

    def cut(self: Step, step: int, sends: Sequence[Any] = (), recvs: Sequence[Any] = ()) -> None:
        hit = cuts.pop((self.call.seq, step), None)
        if hit is None:
            return xfer(self, step, sends, recvs)
        peer, how = hit
        if how == "lose":
            xfer(self, step, [s for s in sends if s[0] != peer], recvs)
            self.transport.drop_link(peer)
            return None
        self.transport.drop_link(peer)
        return xfer(self, step, sends, recvs)

    Step.xfer = cut  # type: ignore[method-assign]


def main() -> int:
    comm = cclctl.init()
    n, rank = comm.world_size, comm.rank
    _cutting(rank, os.environ.get("CUTS", ""))
    calls: dict[str, Callable[[int], np.ndarray]] = {
        "sum": lambda seq: comm.all_reduce(call_input(seq, rank, COUNT)),
        "gather": lambda seq: comm.all_gather(
            call_input(seq, rank, COUNT), np.empty(n * COUNT, np.float32)
        ),
        "bcast": lambda seq: comm.broadcast(call_input(seq, rank, COUNT), root=0),
        "scatter": lambda seq: comm.reduce_scatter(
            call_input(seq, rank, n * COUNT), np.empty(COUNT, np.float32)
        ),
    }
    for i, name in enumerate(os.environ["CALLS"].split(",")):
        print(f"result {i + 1} {digest(calls[name](i + 1))}", flush=True)
    print(f"epoch {comm.failure.epoch}", flush=True)
    comm.close()
    print("done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
