"""A rank of a retry job whose calls are every collective a retry re-runs, ``ITERS`` times.

Each iteration (``CALLS``, or the comma-separated names in the variable ``CALLS``): an
all_gather out of place, one in place (this rank's slot of ``out``), a broadcast in place
from the last rank, one out of place from rank 0, a barrier and an in-place all_reduce, of
inputs the test can compute (``retry_worker.rank_input``); the others of :data:`OPS` by
name. Before each call the rank prints ``call <i> <call>``; after each that gives this rank
a result, ``result <i> <call> <sha256 of the result>``; at the end ``epoch <n>`` and
``done``. A failed call prints ``failed <i> <call> <error>`` (and, with ``HOLD`` set, waits
for that file before it exits). ``leave`` is an all_reduce on every rank but the last,
which waits between calls until the job's failure reaches it, closes, prints ``left`` and
exits 0.
"""

from __future__ import annotations

import hashlib
import os
import sys
import time
from collections.abc import Callable

import numpy as np
from retry_worker import rank_input

import cclctl
from cclctl.errors import CclError

ITERS = int(os.environ.get("ITERS", "2"))
COUNT = int(os.environ.get("COUNT", "65536"))
#: the calls of one iteration, in order (a test's seqs: iteration i's k-th is 6 i + k + 1)
CALLS = ("gather", "gather_in_place", "bcast_in_place", "bcast", "barrier", "sum")
#: the collective each call makes (``scatter``: a reduce_scatter of this rank's input in
#: every chunk; ``reduce``: an in-place sum to rank 0; ``alltoall``: of the input's first
#: ``COUNT // n * n`` elements; ``alltoallv``: of its first elements in blocks of the sizes
#: :func:`v_counts` gives; ``pair``: rank 0's send to rank 1, which its recv takes while
#: the other ranks make no call, and which a retry does not re-run)
OPS = {
    "gather": "all_gather", "gather_in_place": "all_gather", "bcast_in_place": "broadcast",
    "bcast": "broadcast", "barrier": "barrier", "sum": "all_reduce", "scatter": "reduce_scatter",
    "reduce": "reduce", "alltoall": "all_to_all", "alltoallv": "all_to_allv", "pair": "send",
    "leave": "all_reduce",
}  # fmt: skip


def v_counts(n: int, count: int) -> list[list[int]]:
    """``c[i][j]``: the elements rank ``i``'s ``alltoallv`` sends rank ``j`` (whole blocks
    and half ones, in turns)."""
    return [[count // n // (1 + (i + j) % 2) for j in range(n)] for i in range(n)]


def _hold() -> None:
    """With ``HOLD`` (a path) set, a failed rank stays until the test makes that file, so
    the launcher stops no rank before every rank has said how it failed."""
    hold = os.environ.get("HOLD")
    deadline = time.monotonic() + 60
    while hold and not os.path.exists(hold) and time.monotonic() < deadline:
        time.sleep(0.05)


def main() -> int:
    comm = cclctl.init()
    n, rank, last = comm.world_size, comm.rank, comm.world_size - 1
    x0 = rank_input(rank, COUNT)

    def gather() -> np.ndarray:
        out = np.empty(n * COUNT, dtype=np.float32)
        return comm.all_gather(x0.copy(), out)

    def gather_in_place() -> np.ndarray:
        out = np.empty(n * COUNT, dtype=np.float32)
        out[rank * COUNT : (rank + 1) * COUNT] = x0
        return comm.all_gather(out[rank * COUNT : (rank + 1) * COUNT], out)

    def bcast_in_place() -> np.ndarray:
        return comm.broadcast(x0.copy(), root=last)

    def bcast() -> np.ndarray:
        return comm.broadcast(x0.copy(), root=0, out=np.empty_like(x0))

    def barrier() -> None:
        comm.barrier()

    def total() -> np.ndarray:
        return comm.all_reduce(x0.copy())

    def scatter() -> np.ndarray:
        whole = np.concatenate([x0] * n)
        return comm.reduce_scatter(whole, np.empty_like(x0))

    def reduce() -> np.ndarray | None:
        result = comm.reduce(x0.copy(), root=0)
        return result if rank == 0 else None

    def alltoall() -> np.ndarray:
        src = x0[: COUNT // n * n].copy()
        return comm.all_to_all(src, np.empty_like(src))

    def alltoallv() -> np.ndarray:
        c = v_counts(n, COUNT)
        got = [c[i][rank] for i in range(n)]
        out = np.empty(sum(got), dtype=np.float32)
        return comm.all_to_allv(x0[: sum(c[rank])].copy(), out, c[rank], got)

    def pair() -> None:
        if rank == 0:
            comm.send(x0, 1)
        elif rank == 1:
            comm.recv(np.empty_like(x0), 0)

    def leave() -> np.ndarray | None:
        if rank != last:
            return total()
        deadline = time.monotonic() + 60
        while comm.failure.first is None and time.monotonic() < deadline:
            time.sleep(0.01)  # the failure reaches this rank through the store's listener
        comm.close()
        print("left", flush=True)
        sys.exit(0)

    runs: dict[str, Callable[[], np.ndarray | None]] = {
        "gather": gather, "gather_in_place": gather_in_place, "bcast_in_place": bcast_in_place,
        "bcast": bcast, "barrier": barrier, "sum": total, "scatter": scatter, "reduce": reduce,
        "alltoall": alltoall, "alltoallv": alltoallv, "pair": pair, "leave": leave,
    }  # fmt: skip
    calls = os.environ.get("CALLS", ",".join(CALLS)).split(",")
    for i in range(ITERS):
        for call in calls:
            print(f"call {i} {call}", flush=True)
            try:
                result = runs[call]()
            except CclError as exc:
                print(f"failed {i} {call} {exc}", flush=True)
                _hold()
                return 1
            if result is not None:
                print(
                    f"result {i} {call} {hashlib.sha256(result.tobytes()).hexdigest()}", flush=True
                )
    print(f"epoch {comm.failure.epoch}", flush=True)
    comm.close()
    print("done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
