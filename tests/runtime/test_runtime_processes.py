"""Real processes, real rendezvous: the full correctness matrix at world sizes 1 to 7, over
shared memory (the default on one host) and over TCP (``CCLCTL_TRANSPORT=tcp``)."""

from __future__ import annotations

import json
import sys
from typing import Any

import matrix_worker
import pytest

from cclctl.launch.launcher import launch
from cclctl.runtime.comm import selection
from scripts import script

pytestmark = pytest.mark.slow  # real multi-process jobs, up to 7 ranks
WORKER = script("matrix_worker.py")


def _run_matrix(n: int, env: dict[str, str]) -> list[dict[str, Any]]:
    """Run the matrix on ``n`` real ranks; every rank's report, checked to be clean."""
    lines: list[tuple[int, str]] = []
    result = launch(
        [sys.executable, WORKER],
        n,
        env=env,
        output=lambda rank, stream, line: lines.append((rank, line)),
        timeout_s=200,
    )
    reports = [json.loads(line) for _, line in lines if line.startswith("{")]
    assert result.returncode == 0, "\n".join(f"[{r}] {line}" for r, line in lines[-40:])
    assert sorted(rep["rank"] for rep in reports) == list(range(n))
    assert all(rep["failures"] == [] for rep in reports)
    return reports


@pytest.mark.timeout(240)
@pytest.mark.parametrize("transport", ["auto", "tcp"])
@pytest.mark.parametrize("n", [1, 2, 3, 4, 7])
def test_every_collective_dtype_and_reduction_matches_numpy(n: int, transport: str) -> None:
    """Every collective x dtype x reduction x in/out-of-place, with 0, 1, odd and large counts."""
    reports = _run_matrix(n, {"CCLCTL_TRANSPORT": transport})
    assert all(rep["cases"] > 1000 for rep in reports)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("n", [2, 3, 4])
def test_the_matrix_on_shared_buffers_runs_zero_copy_and_matches_numpy(n: int) -> None:
    """The same matrix with every buffer from ``comm.empty()``: all_reduce, all_gather,
    reduce_scatter and broadcast run zero-copy (peers read each other's buffers) and still
    match numpy bit for bit; the other collectives take their usual path."""
    reports = _run_matrix(n, {"MATRIX_BUFFERS": "shared", "CCLCTL_TRACE_BUFFER": "100000"})
    assert all(rep["cases"] > 1000 for rep in reports)
    assert all(rep["zero_copy"] == _zero_copy_calls(n) for rep in reports), reports


def _zero_copy_calls(n: int) -> int:
    """How many of the worker's calls are large enough to run zero-copy: per dtype, at the
    largest count, 10 all_reduce and 4 broadcast (sized by one rank's buffer), 10
    reduce_scatter and 2 all_gather (sized by all ranks' blocks)."""
    count, total = matrix_worker.COUNTS[-1], 0
    for dtype in matrix_worker.dtypes():
        one = count * dtype.itemsize
        total += 14 * (one >= selection.ZERO_COPY_MIN_BYTES) + 12 * (
            n * one >= selection.ZERO_COPY_MIN_BYTES
        )
    return total
