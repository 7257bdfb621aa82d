"""The ``cclctl`` torch backend against gloo in one torchrun job: all_reduce busbw, the cost
of one small call, a DDP step (asserts nothing; prints ratios on rank 0).

One job per world size runs both backends side by side on the same ranks (the default
group on ``cclctl``, a gloo group of the same ranks beside it), so both see the same
machine and load:

- **busbw**: ``all_reduce`` (float32, SUM) at each size, the slowest rank's time per call
  (after one warm-up call; enough calls below 64 MiB that a run moves 64 MiB), busbw =
  bytes x 2(n-1)/n / time, as nccl-tests counts it; the median of ``--rounds`` runs, the
  backends alternated; ratio cclctl / gloo.
- **an 8-byte call**: blocks of ``dist.all_reduce`` on the cclctl group and of the numpy
  API (``comm.all_reduce``) on the same communicator, alternated so that load drifts hit
  both; the median of the block means, and the backend's added time (backend - numpy),
  in wall time and in this process's CPU time (rank 0's). gloo's is printed beside them.
- **all_to_all_single** (``--a2a-sizes``): busbw (bytes sent x (n-1)/n / time) of three
  forms at each size: no splits; splits that are equal (every rank passes ``[size/n] *
  n``); uneven splits (rank ``r`` sends ``1 + (r + j) % 2 / 2`` blocks' worth to rank
  ``j``), the same on both backends; the median of ``--rounds`` runs, ratio cclctl / gloo.
- **DDP**: a small MLP (several gradient buckets) trained a few steps on each backend;
  the median step time, ratio cclctl / gloo.

Short by design (the machine may be small and busy): few sizes, few iterations. With one
rank (``--nproc-per-node 1``) only the small call is timed: its cost with no peer to wait for.

    torchrun --nproc-per-node 2 benchmarks/torch_backend_vs_gloo.py [--sizes 64K,1M,16M,256M]
        [--iters 5] [--rounds 3] [--blocks 10] [--calls 200] [--steps 10] [--a2a-sizes 1M,16M]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

import cclctl.torch  # noqa: F401  # registers the backend
from cclctl.benchmark.sizes import format_bytes, parse_size


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="64K,1M,16M,256M", help="all_reduce sizes (bytes)")
    p.add_argument("--iters", type=int, default=5, help="timed calls per size, at least (more "
                   "below 64M, so each run moves 64 MiB; fewer above)")  # fmt: skip
    p.add_argument("--rounds", type=int, default=3, help="busbw runs per size and backend "
                   "(alternated; the median is printed)")  # fmt: skip
    p.add_argument("--blocks", type=int, default=10, help="8-byte call blocks per side")
    p.add_argument("--calls", type=int, default=200, help="calls per 8-byte block")
    p.add_argument("--steps", type=int, default=10, help="timed DDP steps per backend")
    p.add_argument("--a2a-sizes", default="", help="all_to_all_single sizes (bytes per rank)")
    return p.parse_args()


def _slowest(seconds: float, gloo: Any) -> float:
    """The largest of every rank's ``seconds`` (through gloo, outside what is timed)."""
    t = torch.tensor([seconds], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=gloo)
    return float(t.item())


def _timed(fn: Callable[[], object], calls: int, group: Any, gloo: Any) -> float:
    """Seconds per call of ``fn``, the slowest rank's, after a barrier on ``group``."""
    dist.barrier(group=group)
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return _slowest((time.perf_counter() - start) / calls, gloo)


def _calls(size: int, iters: int) -> int:
    """Timed calls at ``size``: at least ``iters``, and enough below 64 MiB that the run
    moves 64 MiB (up to 200 calls), so the barrier before it (whose ranks leave it at
    different moments) is a small part of what is timed; half of ``iters`` above."""
    if size > 64 << 20:
        return max(1, iters // 2)
    return max(iters, min(200, (64 << 20) // size))


def _alternated(
    call: Callable[[Any], object], nbytes: float, calls: int, rounds: int, gloo: Any
) -> tuple[float, float]:
    """(cclctl, gloo) GB/s of ``call(group)`` moving ``nbytes`` (bus bytes) per call: one
    warm-up call on each group (links, buffers, plans), then the median over ``rounds`` runs
    of ``calls`` calls, the two backends alternated within each round."""
    speeds: dict[Any, list[float]] = {None: [], gloo: []}
    for group in speeds:
        call(group)
    for _ in range(rounds):
        for group in speeds:
            per_call = _timed(lambda g=group: call(g), calls, group, gloo)
            speeds[group].append(nbytes / per_call / 1e9)
    return statistics.median(speeds[None]), statistics.median(speeds[gloo])


def busbw(sizes: list[int], iters: int, rounds: int, gloo: Any) -> list[tuple[int, float, float]]:
    """(bytes, cclctl busbw, gloo busbw) in GB/s per size (:func:`_alternated`)."""
    n = dist.get_world_size()
    rows = []
    for size in sizes:
        t = torch.zeros(size // 4)  # sums stay finite however many calls
        call = lambda g, x=t: dist.all_reduce(x, group=g)  # noqa: E731
        bus = size * 2 * (n - 1) / n
        rows.append((size, *_alternated(call, bus, _calls(size, iters), rounds, gloo)))
    return rows


def all_to_all(
    sizes: list[int], iters: int, rounds: int, gloo: Any
) -> list[tuple[int, str, float, float]]:
    """(bytes, form, cclctl busbw, gloo busbw) in GB/s per size and form of splits
    (:func:`_alternated`)."""
    n, r = dist.get_world_size(), dist.get_rank()
    rows = []
    for size in sizes:
        count = size // 4 // n * n
        base = count // (2 * n)
        uneven = [base + (r + j) % 2 * base // 2 for j in range(n)]
        forms = {"no splits": None, "equal splits": [count // n] * n, "uneven splits": uneven}
        for form, splits in forms.items():
            rows_in = count if splits is None else sum(splits)
            x, y = torch.zeros(rows_in), torch.empty(rows_in)
            call = lambda g, s=splits, i=x, o=y: dist.all_to_all_single(o, i, s, s, group=g)  # noqa: E731
            bus = rows_in * 4 * (n - 1) / n
            rows.append((size, form, *_alternated(call, bus, _calls(size, iters), rounds, gloo)))
    return rows


def small_call(blocks: int, calls: int, gloo: Any) -> dict[str, tuple[float, float]]:
    """Per path, the median block mean of an 8-byte all_reduce in µs per call: wall time
    (the slowest rank's) and this process's CPU time (all its threads: a handoff to
    another thread counts; less sensitive to the machine's load than the wall clock)."""
    comm = dist.group.WORLD.comm
    t, a = torch.ones(2), np.ones(2, dtype=np.float32)
    paths: dict[str, Callable[[], object]] = {
        "numpy": lambda: comm.all_reduce(a),
        "cclctl": lambda: dist.all_reduce(t),
        "gloo": lambda: dist.all_reduce(t, group=gloo),
    }
    wall: dict[str, list[float]] = {name: [] for name in paths}
    cpu: dict[str, list[float]] = {name: [] for name in paths}
    for fn in paths.values():
        for _ in range(20):
            fn()
    for _ in range(blocks):  # alternated: a load drift hits every path alike
        for name, fn in paths.items():
            group = gloo if name == "gloo" else None
            start = time.process_time()
            wall[name].append(_timed(fn, calls, group, gloo) * 1e6)
            cpu[name].append((time.process_time() - start) / calls * 1e6)
    return {name: (statistics.median(wall[name]), statistics.median(cpu[name])) for name in paths}


def ddp_step(steps: int, gloo: Any) -> dict[str, float]:
    """Median seconds per DDP step (forward, backward, SGD) on each backend."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    times = {}
    for name, group in (("cclctl", None), ("gloo", gloo)):
        torch.manual_seed(0)
        layers = [torch.nn.Linear(256, 256) for _ in range(6)]
        model = torch.nn.Sequential(*[m for layer in layers for m in (layer, torch.nn.ReLU())])
        ddp = DDP(model, process_group=group, bucket_cap_mb=0.5)  # ~1.6 MB: several buckets
        opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
        x = torch.randn(64, 256)
        per_step = []
        for step in range(steps + 2):  # two warm-up steps
            dist.barrier(group=group)
            start = time.perf_counter()
            opt.zero_grad()
            ddp(x).square().mean().backward()
            opt.step()
            if step >= 2:
                per_step.append(_slowest(time.perf_counter() - start, gloo))
        times[name] = statistics.median(per_step)
    return times


def main() -> None:
    args = _args()
    dist.init_process_group("cclctl")
    rank, n = dist.get_rank(), dist.get_world_size()
    gloo = dist.new_group(backend="gloo")
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    alone = n == 1  # one rank: the call's own cost, no peer to wait for (no busbw, no DDP)
    rows = [] if alone else busbw(sizes, args.iters, args.rounds, gloo)
    small = small_call(args.blocks, args.calls, gloo)
    a2a_sizes = [parse_size(x) for x in args.a2a_sizes.split(",") if x]
    a2a = [] if alone else all_to_all(a2a_sizes, args.iters, args.rounds, gloo)
    ddp = {} if alone else ddp_step(args.steps, gloo)
    if rank == 0 and rows:
        print(f"world {n}: all_reduce busbw (GB/s), cclctl backend vs gloo")
        for size, mine, theirs in rows:
            ratio = mine / theirs
            print(f"  {format_bytes(size):>8} cclctl {mine:7.3f} gloo {theirs:7.3f} x{ratio:.2f}")
    if rank == 0:
        for i, what in enumerate(("wall", "CPU")):
            mine, numpy_api = small["cclctl"][i], small["numpy"][i]
            print(f"world {n}: 8-byte all_reduce, {what} us/call (median of block means): "
                  f"backend {mine:.1f}  numpy API {numpy_api:.1f}  "
                  f"added {mine - numpy_api:+.1f}  gloo {small['gloo'][i]:.1f}")  # fmt: skip
    if rank == 0 and a2a:
        print(f"world {n}: all_to_all_single busbw (GB/s), cclctl backend vs gloo")
        for size, form, mine, theirs in a2a:
            print(f"  {format_bytes(size):>8} {form:<14} cclctl {mine:7.3f} gloo {theirs:7.3f} "
                  f"x{mine / theirs:.2f}")  # fmt: skip
    if rank == 0 and ddp:
        mine, theirs = ddp["cclctl"] * 1e3, ddp["gloo"] * 1e3
        print(f"world {n}: DDP step (ms): cclctl {mine:.2f}  gloo {theirs:.2f}  "
              f"gloo/cclctl x{theirs / mine:.2f}")  # fmt: skip
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
