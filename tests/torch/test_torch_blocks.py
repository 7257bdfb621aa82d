"""The torch backend's all_to_all of blocks of any sizes (``backend/blocks.py``) on thread
ranks over shared memory: exact blocks whatever their sizes, one all_to_allv on every rank
whether its own blocks are equal or not, the caller's buffers exchanged as they are, and
the list form's joined buffers reused."""

from __future__ import annotations

import numpy as np
import pytest
from recording_tracer import RecordingTracer
from shm_thread_ranks import run_ranks

pytest.importorskip("torch")

from cclctl.integrations.torch.backend.blocks import BlockExchange, cut
from cclctl.runtime.comm.communicator import Communicator

pytestmark = pytest.mark.timeout(60)


def _block(i: int, j: int, size: int) -> np.ndarray:
    """Rank ``i``'s block for rank ``j``: ``size`` values that name both."""
    return np.arange(size, dtype=np.int64) + 1000 * i + 100 * j


def _call(blocks: BlockExchange, sizes: list[list[int]], whole: bool = False) -> list[list[int]]:
    """Rank ``i`` sends ``sizes[i][j]`` elements to rank ``j``; returns the blocks it got."""
    n, i = len(sizes), blocks.comm.rank
    src = np.concatenate([_block(i, j, sizes[i][j]) for j in range(n)])
    out = np.full(sum(sizes[j][i] for j in range(n)), -1, dtype=np.int64)
    outs = cut(out, [sizes[j][i] for j in range(n)])
    blocks.exchange(outs, cut(src, sizes[i]), (out, src) if whole else None)
    return [o.tolist() for o in outs]


def _want(sizes: list[list[int]], i: int) -> list[list[int]]:
    return [_block(j, i, sizes[j][i]).tolist() for j in range(len(sizes))]


@pytest.mark.parametrize("whole", [True, False])
@pytest.mark.parametrize(
    "sizes",
    [
        [[2, 2, 2], [2, 2, 2], [2, 2, 2]],  # equal everywhere
        [[1, 3, 0], [2, 2, 5], [4, 0, 1]],  # uneven, an empty block among them
        [[1, 1, 1], [1, 2, 2], [1, 2, 2]],  # equal on rank 0 only
    ],
)
def test_every_rank_gets_each_block_whole_and_makes_the_same_calls(
    sizes: list[list[int]], whole: bool
) -> None:
    def body(comm: Communicator) -> tuple[list[list[int]], list[str]]:
        tracer = comm.tracer = RecordingTracer()
        return _call(BlockExchange(comm), sizes, whole), [r.op for r in tracer.started]

    for i, (got, ops) in enumerate(run_ranks(len(sizes), body)):
        assert got == _want(sizes, i)
        assert ops == ["all_to_allv"], ops  # whatever this rank's own blocks


@pytest.mark.parametrize("sizes", [[[3, 3], [3, 3]], [[1, 4], [0, 2]]])
def test_the_callers_buffers_are_exchanged_as_they_are(sizes: list[list[int]]) -> None:
    def body(comm: Communicator) -> tuple[list[list[int]], bool]:
        blocks = BlockExchange(comm)
        got = _call(blocks, sizes, whole=True)
        return got, blocks._joined is None  # no buffers of its own were made

    assert run_ranks(2, body) == [(_want(sizes, i), True) for i in range(2)]


def test_the_joined_buffers_are_kept_for_calls_as_large_or_smaller() -> None:
    def body(comm: Communicator) -> list[bool]:
        blocks = BlockExchange(comm)
        kept = []
        for size in (5, 3, 5, 8):
            sizes = [[size, 1], [1, size]]
            before = blocks._joined
            assert _call(blocks, sizes) == _want(sizes, comm.rank)
            kept.append(before is not None and blocks._joined is before)
        return kept

    # the first call makes them, the smaller and the equal reuse them, the larger makes new
    assert run_ranks(2, body) == [[False, True, True, False]] * 2
