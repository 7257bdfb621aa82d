"""One rank of ``benchmarks/peers.py``: time collectives on cclctl, gloo or Open MPI.

Every runtime is driven the same way: float32 buffers of zeros (sums never overflow) whose
pages are written before the timing (see :func:`zeros`), the same warm-up, the same number
of timed calls, the best of ``--reps`` blocks, and the time of a block is the slowest
rank's (taken with the runtime's own max all-reduce). Rank 0 prints one JSON line per
measurement.

    python benchmarks/peers_worker.py --runtime cclctl|cclctl-zc|gloo|mpi --sizes 1024
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

Op = Callable[[], object]


class Cclctl:
    def __init__(self, shared: bool = False) -> None:
        """``shared``: buffers from ``comm.empty()``, which one-host ranks read zero-copy."""
        import cclctl

        self.comm = cclctl.init()
        self.rank, self.size = self.comm.rank, self.comm.world_size
        self.shared = shared
        self.name = "cclctl-zc" if shared else f"cclctl-{self.comm.transport.name}"

    def zeros(self, count: int) -> np.ndarray:
        zeros = self.comm.zeros if self.shared else np.zeros
        return zeros(count, np.float32)

    def ops(self, x: np.ndarray, big: np.ndarray, part: np.ndarray) -> dict[str, Op]:
        c = self.comm
        return {
            "all_reduce": lambda: c.all_reduce(x),
            "all_gather": lambda: c.all_gather(part, big),
            "reduce_scatter": lambda: c.reduce_scatter(big, part),
            "broadcast": lambda: c.broadcast(x, root=0),
            "all_to_all": lambda: c.all_to_all(x, big),
        }

    def slowest(self, seconds: float) -> float:
        return float(self.comm.all_reduce(np.array([seconds]), op="max")[0])

    def close(self) -> None:
        self.comm.close()


class Gloo:
    def __init__(self) -> None:
        import torch
        import torch.distributed as dist

        dist.init_process_group("gloo")
        self.torch, self.dist = torch, dist
        self.rank, self.size = dist.get_rank(), dist.get_world_size()
        self.name = "gloo"

    def ops(self, x: np.ndarray, big: np.ndarray, part: np.ndarray) -> dict[str, Op]:
        t, d = self.torch.from_numpy, self.dist
        tx, tbig, tpart = t(x), t(big), t(part)
        return {
            "all_reduce": lambda: d.all_reduce(tx),
            "all_gather": lambda: d.all_gather_into_tensor(tbig, tpart),
            "reduce_scatter": lambda: d.reduce_scatter_tensor(tpart, tbig),
            "broadcast": lambda: d.broadcast(tx, src=0),
            "all_to_all": lambda: d.all_to_all_single(tbig, tx),
        }

    def slowest(self, seconds: float) -> float:
        value = self.torch.tensor([seconds], dtype=self.torch.float64)
        self.dist.all_reduce(value, op=self.dist.ReduceOp.MAX)
        return float(value[0])

    def close(self) -> None:
        self.dist.destroy_process_group()


class Mpi:
    def __init__(self) -> None:
        from mpi4py import MPI

        self.mpi, self.comm = MPI, MPI.COMM_WORLD
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()
        self.name = "openmpi"

    def ops(self, x: np.ndarray, big: np.ndarray, part: np.ndarray) -> dict[str, Op]:
        c, inplace = self.comm, self.mpi.IN_PLACE
        return {
            "all_reduce": lambda: c.Allreduce(inplace, x),
            "all_gather": lambda: c.Allgather(part, big),
            "reduce_scatter": lambda: c.Reduce_scatter_block(big, part),
            "broadcast": lambda: c.Bcast(x, root=0),
            "all_to_all": lambda: c.Alltoall(x, big),
        }

    def slowest(self, seconds: float) -> float:
        return float(self.comm.allreduce(seconds, op=self.mpi.MAX))

    def close(self) -> None:
        pass


RUNTIMES: dict[str, Callable[[], Any]] = {
    "cclctl": Cclctl,
    "cclctl-zc": lambda: Cclctl(shared=True),
    "gloo": Gloo,
    "mpi": Mpi,
}


def zeros(rt: Any, count: int) -> np.ndarray:
    """Float32 zeros where the runtime wants its buffers (cclctl-zc: shared buffers), with
    every page written once.

    ``np.zeros`` of a large array maps fresh pages that all read from the kernel's one zero
    page until written, and that page sits in L1: a buffer that a collective only reads
    (all_gather's input, reduce_scatter's, broadcast's root) then costs no memory traffic.
    Open MPI's 16 MiB all_gather here took 1.1 ms from such an input, 1.5 ms from one whose
    pages were written.
    """
    arr = rt.zeros(count) if hasattr(rt, "zeros") else np.zeros(count, np.float32)
    arr.fill(0)
    return arr


def calls_for(nbytes: int) -> tuple[int, int]:
    """(warm-up, timed) calls: about 64 MiB moved per block, at least 2 timed calls."""
    timed = max(2, min(500, (64 << 20) // max(nbytes, 1)))
    return (1 if nbytes >= 16 << 20 else 3), timed


def time_op(rt: Any, fn: Op, warmup: int, calls: int, reps: int) -> float:
    for _ in range(warmup):
        fn()
    best = float("inf")
    for _ in range(reps):
        rt.slowest(0.0)  # a barrier that every runtime has
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, rt.slowest((time.perf_counter() - t0) / calls))
    return best


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runtime", choices=sorted(RUNTIMES), required=True)
    ap.add_argument("--ops", default="all_reduce")
    ap.add_argument("--sizes", default="1024")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--latency-calls", type=int, default=2000)
    args = ap.parse_args()
    rt = RUNTIMES[args.runtime]()
    n = rt.size

    def emit(**fields: object) -> None:
        if rt.rank == 0:
            print(json.dumps({"runtime": rt.name, "ranks": n, **fields}), flush=True)

    if args.latency_calls:
        tiny = zeros(rt, 2)
        fn = rt.ops(tiny, zeros(rt, 2 * n), tiny)["all_reduce"]
        emit(
            op="all_reduce",
            size=8,
            latency=True,
            seconds=time_op(rt, fn, 50, args.latency_calls, args.reps),
        )
    for size in (int(s) for s in args.sizes.split(",")):
        count = max(size // 4 // n * n, n)  # divisible by the world size for the gathers
        x = zeros(rt, count)
        big = zeros(rt, count)
        part = zeros(rt, count // n)
        for op, fn in rt.ops(x, big, part).items():
            if op not in args.ops.split(","):
                continue
            warmup, calls = calls_for(size)
            try:
                seconds = time_op(rt, fn, warmup, calls, args.reps)
            except (RuntimeError, NotImplementedError) as exc:  # e.g. an op gloo lacks
                emit(op=op, size=count * 4, skipped=str(exc).splitlines()[0][:120])
                continue
            emit(op=op, size=count * 4, seconds=seconds)
        del x, big, part
    rt.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
