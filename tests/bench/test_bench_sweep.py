"""The sweep on real communicators (thread ranks over loopback TCP): rank-consistent rows,
zero wrong elements for correct collectives, and wrong ones caught."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from thread_ranks import run_ranks

from cclctl.benchmark import events
from cclctl.benchmark.catalog import OPS, REDOPS
from cclctl.benchmark.options import BenchOptions
from cclctl.benchmark.results import RankInfo, Row, RunMeta
from cclctl.benchmark.selftest import Corruption
from cclctl.benchmark.sweep import Sweep, gather_meta, total_rows
from cclctl.launch.output import MAX_LINE_BYTES
from cclctl.runtime.comm.communicator import Communicator


def _opts(**changes: Any) -> BenchOptions:
    base: dict[str, Any] = {
        "minbytes": 8,
        "maxbytes": 64 << 10,
        "stepfactor": 8,
        "iters": 1,
        "warmup_iters": 0,
    }
    return BenchOptions(**(base | changes))


def _sweep(n: int, opts: BenchOptions, corrupt: Corruption | None = None) -> list[list[Row]]:
    return run_ranks(n, lambda comm: list(Sweep(comm, opts, corrupt).rows()), timeout_s=60)


@pytest.mark.timeout(60)
def test_every_op_checks_clean_and_all_ranks_agree() -> None:
    opts = _opts(ops=OPS, dtype="float16", root=2)
    per_rank = _sweep(3, opts)
    rows = per_rank[0]
    assert per_rank[1] == rows and per_rank[2] == rows  # times and #wrong are all-reduced
    assert len(rows) == total_rows(opts, 3)
    for row in rows:
        assert row.out_of_place.wrong == 0, row
        expected_inplace = None if row.op == "sendrecv" else 0  # as nccl-tests: not checked
        assert row.in_place.wrong == expected_inplace, row
        assert row.out_of_place.time_us > 0 and row.out_of_place.algbw > 0
        assert row.type == "half"
        assert row.root == (2 if row.op in ("broadcast", "reduce") else -1)
        assert row.redop == (
            "sum" if row.op in ("all_reduce", "reduce_scatter", "reduce") else "none"
        )
    gathered = [r for r in rows if r.op == "all_gather"]
    assert [r.size for r in gathered] == [6, 60, 510, 4092, 32766]  # multiples of 3 x 2 bytes
    assert [r.count for r in gathered] == [1, 10, 85, 682, 5461]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("dtype", ["bfloat16", "int8", "uint8", "float64"])
def test_every_reduction_checks_clean(dtype: str) -> None:
    ops = ("all_reduce", "reduce_scatter", "reduce")

    def body(comm: Communicator) -> list[Row]:
        rows: list[Row] = []
        for redop in REDOPS:
            opts = _opts(ops=ops, dtype=dtype, redop=redop, maxbytes=512, stepfactor=64, root=1)
            rows += Sweep(comm, opts).rows()
        return rows

    rows = run_ranks(3, body, timeout_s=60)[0]
    assert len(rows) == len(REDOPS) * total_rows(
        _opts(ops=ops, dtype=dtype, maxbytes=512, stepfactor=64), 3
    )
    assert {(r.redop, r.out_of_place.wrong, r.in_place.wrong) for r in rows} == {
        (redop, 0, 0) for redop in REDOPS
    }


@pytest.mark.timeout(60)
def test_corruption_self_test_shows_up_as_wrong_elements_of_that_op_only() -> None:
    opts = _opts(ops=("all_reduce", "all_gather"), maxbytes=4 << 10)
    rows = _sweep(2, opts, Corruption(1, "all_gather"))[0]
    for row in rows:
        want = 1 if row.op == "all_gather" else 0
        assert (row.out_of_place.wrong, row.in_place.wrong) == (want, want), row


class _LazyAllReduce:
    """A broken communicator: out-of-place all_reduce leaves ``out`` untouched."""

    def __init__(self, comm: Communicator) -> None:
        self._comm = comm

    def __getattr__(self, name: str) -> Any:
        return getattr(self._comm, name)

    def all_reduce(self, buf: np.ndarray, op: str = "sum", out: np.ndarray | None = None) -> Any:
        return self._comm.all_reduce(buf if out is None else buf.copy(), op=op)


@pytest.mark.timeout(60)
def test_a_collective_that_never_writes_its_output_is_caught() -> None:
    opts = _opts(maxbytes=1 << 10)
    rows = run_ranks(2, lambda comm: list(Sweep(_LazyAllReduce(comm), opts).rows()))[0]
    for row in rows:
        assert row.out_of_place.wrong is not None
        assert row.out_of_place.wrong > row.count // 2, row  # both ranks, most elements
        assert row.in_place.wrong == 0


@pytest.mark.timeout(60)
def test_without_check_nothing_is_counted() -> None:
    rows = _sweep(2, _opts(ops=("broadcast",), check=False, maxbytes=512))[0]
    assert rows and all(r.out_of_place.wrong is None and r.in_place.wrong is None for r in rows)


@pytest.mark.timeout(60)
def test_metadata_and_the_event_stream_round_trip() -> None:
    opts = _opts(ops=("all_reduce",), maxbytes=64)

    def body(comm: Communicator) -> tuple[Any, list[Row]]:
        return gather_meta(comm, opts), list(Sweep(comm, opts).rows())

    meta, rows = run_ranks(2, body)[0]
    assert meta.world_size == 2 and meta.backend == "cclctl"
    assert [info.rank for info in meta.ranks] == [0, 1]
    assert len(meta.hosts) == 1 and meta.hosts[0]

    collector = events.Collector()
    end = events.end_line("2024-01-01T00:00:00+00:00")
    stray = "a stray print from a library"
    lines = [*events.meta_lines(meta), stray, *(events.row_line(r) for r in rows), end]
    fed = [collector.feed(line) for line in lines]
    assert [row for row in fed if row is not None] == rows
    assert collector.ended and collector.foreign == [stray]
    assert collector.meta == meta.finished("2024-01-01T00:00:00+00:00")


def test_no_stream_line_grows_with_the_world_size() -> None:
    """The launcher splits lines over 64 KiB; a 1024-rank job's metadata must still parse."""
    ranks = tuple(RankInfo(r, "h" * 64, 100000 + r) for r in range(1024))
    meta = RunMeta(1024, ranks, "cclctl", "0.1.0", _opts().to_dict(), "start")
    lines = events.meta_lines(meta)
    assert max(len(line.encode()) for line in lines) < MAX_LINE_BYTES // 16
    collector = events.Collector()
    for line in lines:
        collector.feed(line)
    assert collector.meta == meta and not collector.foreign
