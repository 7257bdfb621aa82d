"""all_to_allv, the all_to_all of blocks of any sizes, on thread ranks over every transport:
each block exact (empty ones among them, in place or not), one algorithm on every rank
whatever its sizes, a block's size two ranks disagree on (or a rank in another call) a
mismatch naming both sides, and bad counts refused in words before anything moves."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from recording_tracer import RecordingTracer
from shm_thread_ranks import CFG as SHM_CFG
from shm_thread_ranks import run_ranks as shm_run_ranks
from thread_ranks import run_ranks

from cclctl.config import RuntimeConfig
from cclctl.errors import CclError, InvalidArgument
from cclctl.runtime.comm import selection
from cclctl.runtime.comm.communicator import Communicator

pytestmark = pytest.mark.timeout(60)
FAST_FAIL = RuntimeConfig(job="t", timeout_s=5.0, connect_timeout_s=5.0)
_FAST_SHM = dataclasses.replace(SHM_CFG, timeout_s=5.0)
Runner = Callable[[int, Callable[[Communicator], Any]], list[Any]]

#: How each transport runs the ranks: TCP, shared memory (single-copy reads, and the slots
#: without them), and the hybrid (ranks on two hosts in turn: pairwise steps over TCP and
#: shared memory)
RUNNERS: dict[str, Runner] = {
    "tcp": lambda n, fn: run_ranks(n, fn),
    "shm_cma": lambda n, fn: shm_run_ranks(n, fn),
    "shm_slots": lambda n, fn: shm_run_ranks(n, fn, cross_memory=False),
    "hybrid": lambda n, fn: shm_run_ranks(n, fn, hosts=["a", "b", "a", "b"][:n]),
}


def _counts(n: int, seed: int) -> np.ndarray:
    """``c[i, j]``: elements rank ``i`` sends rank ``j``; some 0, rank 0's to rank 1 too."""
    c = np.random.default_rng(seed).integers(0, 7, size=(n, n))
    c[0, 1 % n] = 0
    return c


def _block(i: int, j: int, size: int) -> np.ndarray:
    """Rank ``i``'s block for rank ``j``: values that name both."""
    return (np.arange(size) + 1000 * i + 100 * j).astype(np.float32)


@pytest.mark.parametrize("transport", sorted(RUNNERS))
@pytest.mark.parametrize("n", [2, 3, 4])
def test_every_block_arrives_whole_whatever_its_size(transport: str, n: int) -> None:
    c = _counts(n, seed=n)

    def body(comm: Communicator) -> tuple[np.ndarray, list[str]]:
        r = comm.rank
        comm.tracer = tracer = RecordingTracer()
        src = np.concatenate([_block(r, j, c[r, j]) for j in range(n)])
        out = np.full(c[:, r].sum(), -1, dtype=np.float32)
        got = comm.all_to_allv(src, out, c[r].tolist(), c[:, r].tolist())
        assert got is out
        return out, [f"{rec.op}/{rec.algo}/{rec.count}" for rec in tracer.finished]

    want_algo = "shm_cma" if transport == "shm_cma" else "pairwise"  # by the engines alone
    for r, (out, ops) in enumerate(RUNNERS[transport](n, body)):
        want = np.concatenate([_block(i, r, c[i, r]) for i in range(n)])
        assert out.tobytes() == want.tobytes()
        assert ops == [f"all_to_allv/{want_algo}/{c[r].sum()}"], ops


@pytest.mark.parametrize("transport", ["tcp", "shm_cma", "shm_slots"])
def test_in_place_and_all_empty_blocks(transport: str) -> None:
    """``buf`` is ``out`` (each rank sends as much as it receives), then a call of no
    elements at all: both exact, and the ranks go on in step."""
    c = np.array([[2, 1, 3], [1, 0, 2], [3, 2, 1]])
    assert (c.sum(axis=1) == c.sum(axis=0)).all()  # each rank sends what it receives

    def body(comm: Communicator) -> tuple[np.ndarray, np.ndarray]:
        r = comm.rank
        buf = np.concatenate([_block(r, j, c[r, j]) for j in range(3)])
        comm.all_to_allv(buf, buf, c[r].tolist(), c[:, r].tolist())
        empty = np.empty(0, dtype=np.float32)
        comm.all_to_allv(empty, empty, [0, 0, 0], [0, 0, 0])
        total = comm.all_reduce(np.ones(1, dtype=np.float32))
        return buf, total

    for r, (buf, total) in enumerate(RUNNERS[transport](3, body)):
        assert buf.tobytes() == np.concatenate([_block(i, r, c[i, r]) for i in range(3)]).tobytes()
        assert total.tolist() == [3.0]


def _disagree(comm: Communicator) -> str:
    """Rank 0 sends rank 1 three elements; rank 1 expects two."""
    send, recv = ([1, 3], [1, 2]) if comm.rank == 0 else ([2, 1], [2, 1])
    src = np.arange(sum(send), dtype=np.float32)
    try:
        comm.all_to_allv(src, np.empty(sum(recv), np.float32), send, recv)
    except CclError as exc:
        return f"{type(exc).__name__}: {exc}"
    return "completed"


@pytest.mark.parametrize("transport", ["tcp", "shm_slots"])
def test_a_block_size_the_pair_disagrees_on_fails_naming_both_sides_in_messages(
    transport: str,
) -> None:
    if transport == "tcp":
        rank0, rank1 = run_ranks(2, _disagree, FAST_FAIL)
    else:
        rank0, rank1 = shm_run_ranks(2, _disagree, _FAST_SHM, cross_memory=False)
    # rank 0 got what it expected from rank 1; rank 1 names what each side sent and expects
    assert rank0 == "completed"
    assert rank1.startswith("ProtocolError"), rank1
    assert "rank 0 called all_to_allv(float32, counts by rank) step 1 (12 bytes)" in rank1
    assert "where rank 1 called all_to_allv(float32, counts by rank) step 1 (8 bytes)" in rank1


def test_a_block_size_the_pair_disagrees_on_fails_naming_both_sides_in_single_copy() -> None:
    got = shm_run_ranks(2, _disagree, _FAST_SHM)
    words = (
        "rank 0 called all_to_allv(float32, counts by rank) sending 3 elements to rank 1 "
        "where rank 1 called all_to_allv(float32, counts by rank) expecting 2 elements from it"
    )
    assert all(words in text for text in got), got  # both ranks: one failure, named alike


def test_a_rank_in_all_to_all_while_the_others_are_in_all_to_allv_is_a_mismatch() -> None:
    """torch's all_to_all_single with splits on one rank and without on another."""

    def body(comm: Communicator) -> str:
        x = np.arange(4, dtype=np.float32)
        try:
            if comm.rank == 0:
                comm.all_to_all(x, np.empty_like(x))
            else:
                comm.all_to_allv(x, np.empty_like(x), [2, 2], [2, 2])
        except CclError as exc:
            return f"{type(exc).__name__}: {exc}"
        return "completed"

    got = run_ranks(2, body, FAST_FAIL)
    assert any("all_to_all(float32, count 4)" in t and "all_to_allv(float32, counts by rank)"
               in t for t in got), got  # fmt: skip
    assert all(t != "completed" for t in got), got


@pytest.mark.parametrize(
    ("send", "recv", "words"),
    [
        ([1, 2, 3], [3, 3], "send_counts has 3 counts; the world has 2 ranks"),
        ([4, -1], [3, 0], "send_counts [4, -1] has a negative count"),
        ([1, 1], [3, 3], "send_counts sum to 2 elements, but the buffer has 3"),
        ([1, 2], [1, 1], "recv_counts sum to 2 elements, but the buffer has 6"),
        ([1.5, 1.5], [3, 3], "send_counts must be a sequence of 2 integers"),
        (3, [3, 3], "send_counts must be a sequence of 2 integers"),
        ([2, 1], [4, 2], "sends itself 2 elements but expects 4"),  # rank 0's words
    ],
)
def test_bad_counts_are_refused_in_words_before_anything_moves(
    send: Any, recv: Any, words: str
) -> None:
    def body(comm: Communicator) -> str:
        src, out = np.zeros(3, np.float32), np.zeros(6, np.float32)
        with pytest.raises(InvalidArgument) as info:
            comm.all_to_allv(src, out, send, recv)
        comm.barrier()  # nothing moved: the ranks are still in step
        return str(info.value)

    rank0, rank1 = run_ranks(2, body, FAST_FAIL)
    assert rank0.startswith("all_to_allv: ") and words in rank0, rank0
    assert rank1.startswith("all_to_allv: "), rank1


def test_another_dtype_out_is_refused() -> None:
    def body(comm: Communicator) -> str:
        with pytest.raises(InvalidArgument, match="out has dtype int32 but the input is float32"):
            comm.all_to_allv(np.zeros(2, np.float32), np.zeros(2, np.int32), [1, 1], [1, 1])
        return "refused"

    assert run_ranks(2, body, FAST_FAIL) == ["refused", "refused"]


def test_it_is_chosen_by_the_engines_alone_and_takes_no_size_threshold() -> None:
    with pytest.raises(Exception, match="all_to_allv takes no size threshold"):
        selection.parse("all_to_allv>=1M=pairwise")
    assert selection.parse("all_to_allv=pairwise").forced == {"all_to_allv": "pairwise"}


def test_each_rank_records_the_elements_it_sends() -> None:
    c = np.array([[1, 2], [5, 0]])

    def body(comm: Communicator) -> list[tuple[str, int, int]]:
        r = comm.rank
        comm.tracer = tracer = RecordingTracer()
        src = np.zeros(c[r].sum(), np.float32)
        comm.all_to_allv(src, np.zeros(c[:, r].sum(), np.float32), c[r].tolist(), c[:, r].tolist())
        return [(rec.op, rec.count, rec.nbytes) for rec in tracer.finished]

    assert run_ranks(2, body) == [[("all_to_allv", 3, 12)], [("all_to_allv", 5, 20)]]
