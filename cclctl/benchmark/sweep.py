"""Run the size sweep on a communicator, one Row at a time, the way nccl-tests measures.

Per row and placement: warm-up iterations, a barrier, the timed iterations, then each
rank's mean time combined over the ranks as nccl-tests' ``-a`` says (rank 0's, the average,
the minimum or the maximum), through an all_reduce so every rank reports the same number.
With ``--check`` the inputs are rebuilt, the op runs once more and every element is
compared with the exact expected value; the wrong counts are summed over ranks.
Staged (``--stage always`` on cclctl's runtime) the measured calls go through the relay
(:mod:`.staged`) and each placement also reports the stages' time per call, combined over
the ranks like the row's time, and ``relay_efficiency``; the sweep's own small reductions
(times, wrong counts) stay on the communicator.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Iterator

import numpy as np

import cclctl
from cclctl.bandwidth import algbw_gbps, bus_factor
from cclctl.benchmark.catalog import REDUCING_OPS, ROOTED_OPS, bus_name
from cclctl.benchmark.collectives import Alloc, Communicator, Placement, bind, zeros
from cclctl.benchmark.inputs import Case, count_wrong, expected
from cclctl.benchmark.options import BenchOptions
from cclctl.benchmark.results import (
    RELAY_STAGES,
    RankInfo,
    RelayTiming,
    Row,
    RunMeta,
    Timing,
    now_iso,
)
from cclctl.benchmark.selftest import Corruption
from cclctl.benchmark.sizes import plan
from cclctl.benchmark.staged import StagedComm
from cclctl.runtime.relay.efficiency import relay_efficiency

_HOST_BYTES = 64


def total_rows(opts: BenchOptions, world_size: int) -> int:
    """How many rows a sweep yields, for a progress bar's total."""
    itemsize = opts.dtype_info.itemsize
    return sum(len(plan(op, opts.sizes(), itemsize, world_size)) for op in opts.ops)


def _reduce_scalar(comm: Communicator, value: float | int, op: str, dtype: type) -> np.ndarray:
    buf: np.ndarray = np.array([value], dtype=dtype)
    comm.all_reduce(buf, op=op)
    return buf


def combine_time(comm: Communicator, local: float, average: int) -> float:
    """The row's time from every rank's ``local`` one, by ``-a``: 0 rank 0, 1 avg, 2 min, 3 max."""
    if average == 0:
        return float(_reduce_scalar(comm, local if comm.rank == 0 else 0.0, "sum", np.float64)[0])
    if average == 1:
        return float(_reduce_scalar(comm, local, "sum", np.float64)[0]) / comm.world_size
    return float(_reduce_scalar(comm, local, "min" if average == 2 else "max", np.float64)[0])


def gather_meta(comm: Communicator, opts: BenchOptions) -> RunMeta:
    """Who takes part (host and pid of every rank), gathered over the communicator."""
    n = comm.world_size
    host = socket.gethostname().encode()[:_HOST_BYTES].ljust(_HOST_BYTES, b"\0")
    hosts = np.zeros(n * _HOST_BYTES, dtype=np.uint8)
    comm.all_gather(np.frombuffer(host, dtype=np.uint8).copy(), hosts)
    pids = np.zeros(n, dtype=np.int64)
    comm.all_gather(np.array([os.getpid()], dtype=np.int64), pids)
    ranks = tuple(
        RankInfo(
            r,
            bytes(hosts[r * _HOST_BYTES : (r + 1) * _HOST_BYTES])
            .rstrip(b"\0")
            .decode(errors="replace"),
            int(pids[r]),
        )
        for r in range(n)
    )
    backend = str(getattr(comm, "backend", "cclctl"))
    return RunMeta(n, ranks, backend, cclctl.__version__, opts.to_dict(), now_iso())


class Sweep:
    """The benchmark loop for one rank; every rank of the communicator must run it."""

    def __init__(
        self,
        comm: Communicator,
        opts: BenchOptions,
        corrupt: Corruption | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.comm = comm
        self.opts = opts
        self.corrupt = corrupt
        self.clock = clock
        # --shared-buffers: buffers peers read directly (cclctl's communicator only)
        self.alloc: Alloc = comm.zeros if opts.shared_buffers else zeros  # type: ignore[attr-defined]
        self._staged: StagedComm | None = None  # while rows() runs staged

    def rows(self) -> Iterator[Row]:
        """Every (op, size) row; staged, through one relay whose copy thread ends with it."""
        if not self.opts.staged:
            yield from self._rows()
            return
        self._staged = StagedComm(self.comm)
        try:
            yield from self._rows()
        finally:
            self._staged.close()
            self._staged = None

    def _rows(self) -> Iterator[Row]:
        opts, world = self.opts, self.comm.world_size
        dtype = opts.dtype_info
        dtype.numpy()  # fail early (UsageError) when bfloat16's package is missing
        for op in opts.ops:
            for shape in plan(op, opts.sizes(), dtype.itemsize, world):
                case = Case(op, dtype, opts.redop, opts.root, world, shape)
                yield Row(
                    op=op,
                    size=shape.size,
                    count=shape.count,
                    type=dtype.nccl_name,
                    redop=opts.redop if op in REDUCING_OPS else "none",
                    root=opts.root if op in ROOTED_OPS else -1,
                    out_of_place=self.measure(case, in_place=False),
                    in_place=self.measure(case, in_place=True),
                )

    def measure(self, case: Case, in_place: bool) -> Timing:
        """Time one placement of ``case`` and, with --check, count its wrong elements."""
        comm, size = self.comm, case.shape.size
        staged = self._staged
        placement = bind(staged or comm, case, in_place, self.alloc)
        on_device = getattr(comm, "on_device", None)  # torch's nccl: buffers on the GPU
        if on_device is not None:
            placement = on_device(placement)
        iters = self.opts.iters_for(size)
        with np.errstate(all="ignore"):  # repeated in-place sums may overflow: only timed
            for _ in range(self.opts.warmup_for(size)):
                placement.run()
            comm.barrier()
            if staged is not None:
                staged.take()  # the warm-up's stages are not this placement's
            start = self.clock()
            for _ in range(iters):
                placement.run()
            local = (self.clock() - start) / iters
        seconds = combine_time(comm, local, self.opts.average)
        relay = None if staged is None else self._relay_timing(case, staged, seconds)
        wrong = None
        if self.opts.check and placement.result is not None:
            wrong = self._check(case, placement)
        algbw = algbw_gbps(size, seconds)
        busbw = algbw * bus_factor(bus_name(case.op), case.world)
        return Timing(seconds * 1e6, algbw, busbw, wrong, relay)

    def _relay_timing(self, case: Case, staged: StagedComm, seconds: float) -> RelayTiming | None:
        """The timed calls' stages per call, combined over the ranks as the time is, and the
        relay's efficiency at the row's time; None for an op the relay does not run."""
        calls, totals = staged.take()
        if not calls:  # the same on every rank: sendrecv is not relayed
            return None
        per_call = {
            name: combine_time(self.comm, totals[name] / calls / 1e9, self.opts.average)
            for name in RELAY_STAGES
        }
        efficiency = relay_efficiency(
            bus_name(case.op),
            case.shape.size,
            case.world,
            round(seconds * 1e9),
            {name: round(value * 1e9) for name, value in per_call.items()},
        )
        d2h, collective, h2d = (per_call[name] * 1e6 for name in RELAY_STAGES)
        return RelayTiming(d2h, collective, h2d, efficiency)

    def _check(self, case: Case, placement: Placement) -> int:
        """Run once more from fresh inputs; wrong elements summed over all ranks."""
        placement.reset()
        placement.run()
        rank, result = self.comm.rank, placement.result
        want = expected(case, rank)
        local = 0
        if want is not None and result is not None:
            if self.corrupt and self.corrupt.applies(rank, case.op, case.shape.size):
                self.corrupt.apply(result)
            local = count_wrong(result, want)
        return int(_reduce_scalar(self.comm, local, "sum", np.int64)[0])
