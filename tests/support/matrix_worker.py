"""One rank of the correctness matrix: every collective × dtype × reduction × in/out-of-place.

Run as a real process under the launcher. Inputs are small integers, so every expected value
is exact in every dtype and the numpy reference (computed independently on each rank from
every rank's input) must match bit for bit. Prints one JSON line and exits 1 on any mismatch.
With ``MATRIX_BUFFERS=shared`` every buffer a collective gets comes from ``comm.empty()``
(zero-copy over shared memory); the report counts the calls that ran zero-copy.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable

import numpy as np

import cclctl

DTYPES = ["float16", "float32", "float64", "int8", "int32", "int64", "uint8"]
try:
    import ml_dtypes

    BF16: np.dtype | None = np.dtype(ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover - the test extra installs it
    BF16 = None
REDOPS = ["sum", "prod", "min", "max", "avg"]
COUNTS = [0, 1, 7, 70_001]  # 70,001 elements crosses every large-message threshold


def dtypes() -> list[np.dtype]:
    return [np.dtype(d) for d in DTYPES] + ([BF16] if BF16 is not None else [])


def make_input(rank: int, count: int, dtype: np.dtype, redop: str) -> np.ndarray:
    i = np.arange(count)
    if redop == "prod":  # 1s and 2s: 2**7 stays exact (or wraps identically for int8)
        return (1 + ((i + rank) % 3 == 0)).astype(dtype)
    return ((rank * 3 + i * 7) % 5 + 1).astype(dtype)


def reference(inputs: list[np.ndarray], redop: str) -> np.ndarray:
    stack = np.stack(inputs)
    dtype = inputs[0].dtype
    if redop in ("sum", "avg"):
        total = np.add.reduce(stack, axis=0, dtype=dtype)
        if redop == "avg":
            if dtype.kind == "f" or dtype == BF16:
                return (total / np.asarray(len(inputs), dtype=dtype)).astype(dtype)
            exact = np.add.reduce(stack.astype(np.int64), axis=0)
            return np.fix(exact / len(inputs)).astype(dtype)
        return total
    fn = {"prod": np.multiply, "min": np.minimum, "max": np.maximum}[redop]
    return fn.reduce(stack, axis=0, dtype=dtype)


class Buffers:
    """Where the worker puts the buffers it hands to collectives: numpy's memory, or shared
    buffers from ``comm.empty()``."""

    def __init__(self, comm: cclctl.runtime.comm.communicator.Communicator, shared: bool) -> None:
        self.comm = comm
        self.shared = shared

    def zeros(self, shape: int, dtype: np.dtype) -> np.ndarray:
        return self.comm.zeros(shape, dtype) if self.shared else np.zeros(shape, dtype)

    def copy(self, x: np.ndarray) -> np.ndarray:
        arr = self.zeros(x.size, x.dtype)
        arr[...] = x
        return arr


def main() -> int:
    comm = cclctl.init()
    mem = Buffers(comm, os.environ.get("MATRIX_BUFFERS") == "shared")
    zero_copy = 0
    r, n = comm.rank, comm.world_size
    failures: list[str] = []
    cases = 0

    def check(name: str, got: np.ndarray, want: np.ndarray) -> None:
        nonlocal cases
        cases += 1
        if got.dtype != want.dtype or not np.array_equal(got.view(np.uint8), want.view(np.uint8)):
            bad = int(np.count_nonzero(got != want)) if got.shape == want.shape else -1
            failures.append(f"{name}: {bad} wrong of {want.size}")

    for dtype in dtypes():
        for count in COUNTS:
            for redop in REDOPS:
                inputs = [make_input(k, count, dtype, redop) for k in range(n)]
                want = reference(inputs, redop)
                tag = f"{dtype.name}/{count}/{redop}"
                for inplace in (False, True):
                    mode = "in" if inplace else "out"
                    run_reducing(comm, mem, inputs, want, redop, inplace, f"{tag}/{mode}", check)
            inputs = [make_input(k, count, dtype, "sum") for k in range(n)]
            for inplace in (False, True):
                run_moving(
                    comm,
                    mem,
                    inputs,
                    inplace,
                    f"{dtype.name}/{count}/{'in' if inplace else 'out'}",
                    check,
                )
    comm.barrier()
    tracer = comm.tracer  # run with a trace buffer large enough to hold every call
    if tracer is not None:
        zero_copy = sum(rec.algo == "shm_zero_copy" for rec in tracer.records())
    comm.close()
    report = {"rank": r, "cases": cases, "failures": failures[:20], "zero_copy": zero_copy}
    print(json.dumps(report))
    return 1 if failures else 0


def run_reducing(
    comm: cclctl.runtime.comm.communicator.Communicator,
    mem: Buffers,
    inputs: list[np.ndarray],
    want: np.ndarray,
    redop: str,
    inplace: bool,
    tag: str,
    check: Callable[[str, np.ndarray, np.ndarray], None],
) -> None:
    r, n = comm.rank, comm.world_size
    mine = mem.copy(inputs[r])
    if inplace:
        comm.all_reduce(mine, op=redop)
        check(f"all_reduce/{tag}", mine, want)
    else:
        out = mem.zeros(mine.size, mine.dtype)
        comm.all_reduce(mine, op=redop, out=out)
        check(f"all_reduce/{tag}", out, want)
        check(f"all_reduce/{tag}/input-intact", mine, inputs[r])
    for root in sorted({0, n - 1}):
        mine = mem.copy(inputs[r])
        if inplace:
            comm.reduce(mine, op=redop, root=root)
            got = mine
        else:
            got = mem.zeros(mine.size, mine.dtype)
            comm.reduce(mine, op=redop, root=root, out=got)
            check(f"reduce/{tag}/root{root}/input-intact", mine, inputs[r])
        if r == root:
            check(f"reduce/{tag}/root{root}", got, want)
    # reduce_scatter: each rank contributes n blocks; block k of the result lands on rank k.
    blocks = [np.concatenate([np.roll(x, k) for k in range(n)]) for x in inputs]
    full = reference(blocks, redop)
    k = inputs[0].size
    mine = mem.copy(blocks[r])
    if inplace:
        comm.reduce_scatter(mine, out=mine[r * k : (r + 1) * k], op=redop)
        got = mine[r * k : (r + 1) * k]
    else:
        got = mem.zeros(k, mine.dtype)
        comm.reduce_scatter(mine, out=got, op=redop)
    check(f"reduce_scatter/{tag}", got, full[r * k : (r + 1) * k])


def run_moving(
    comm: cclctl.runtime.comm.communicator.Communicator,
    mem: Buffers,
    inputs: list[np.ndarray],
    inplace: bool,
    tag: str,
    check: Callable[[str, np.ndarray, np.ndarray], None],
) -> None:
    r, n = comm.rank, comm.world_size
    k = inputs[0].size
    gathered = np.concatenate(inputs)
    if inplace:
        out = mem.zeros(gathered.size, gathered.dtype)
        out[r * k : (r + 1) * k] = inputs[r]
        comm.all_gather(out[r * k : (r + 1) * k], out=out)
    else:
        out = mem.zeros(gathered.size, gathered.dtype)
        comm.all_gather(mem.copy(inputs[r]), out=out)
    check(f"all_gather/{tag}", out, gathered)
    for root in sorted({0, n - 1}):
        buf = mem.copy(inputs[r])
        if inplace:
            comm.broadcast(buf, root=root)
            check(f"broadcast/{tag}/root{root}", buf, inputs[root])
        else:
            out = mem.zeros(buf.size, buf.dtype)
            comm.broadcast(buf, root=root, out=out)
            check(f"broadcast/{tag}/root{root}", out, inputs[root])
    # all_to_all: rank r's block j goes to rank j as its block r.
    sends = [np.concatenate([x + j for j in range(n)]).astype(x.dtype) for x in inputs]
    want = np.concatenate([sends[j][r * k : (r + 1) * k] for j in range(n)])
    mine = mem.copy(sends[r])
    if inplace:
        comm.all_to_all(mine, out=mine)
        check(f"all_to_all/{tag}", mine, want)
    else:
        out = mem.zeros(mine.size, mine.dtype)
        comm.all_to_all(mine, out=out)
        check(f"all_to_all/{tag}", out, want)
    if n > 1:  # a ring of send/recv: even ranks send first, so nobody waits on a waiter
        got = np.zeros_like(inputs[r])
        right, left = (r + 1) % n, (r - 1) % n
        if r % 2 == 0:
            comm.send(inputs[r], right)
            comm.recv(got, left)
        else:
            comm.recv(got, left)
            comm.send(inputs[r], right)
        check(f"send_recv/{tag}", got, inputs[left])


if __name__ == "__main__":
    sys.exit(main())
