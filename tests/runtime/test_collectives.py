"""Collectives on thread ranks over real loopback TCP: results, edge cases and bad input."""

from __future__ import annotations

import numpy as np
import pytest
from recording_tracer import RecordingTracer
from shm_thread_ranks import run_ranks as shm_run_ranks
from thread_ranks import run_ranks

from cclctl.config import RuntimeConfig
from cclctl.errors import CommAborted, CommRevoked, InvalidArgument, PeerError, ProtocolError
from cclctl.records import COMPLETED, FAILED

pytestmark = pytest.mark.timeout(60)
FAST_FAIL = RuntimeConfig(job="t", timeout_s=5.0, connect_timeout_s=5.0)


@pytest.mark.parametrize("n", [2, 3, 5])
@pytest.mark.parametrize("algo", ["rd", "ring"])
def test_all_reduce_is_bit_identical_on_every_rank(n: int, algo: str) -> None:
    """Float sums in different orders would differ; every rank must see the same bits."""
    cfg = RuntimeConfig(job="t", algo=f"all_reduce={algo}")
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal(10_007).astype(np.float32) for _ in range(n)]

    def body(comm):  # type: ignore[no-untyped-def]
        x = inputs[comm.rank].copy()
        comm.all_reduce(x)
        return x

    results = run_ranks(n, body, cfg)
    for got in results[1:]:
        assert got.tobytes() == results[0].tobytes()
    np.testing.assert_allclose(results[0], np.sum(inputs, axis=0), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "spec", ["broadcast=chain", "broadcast=tree", "reduce=ring", "reduce=tree"]
)
def test_forced_algorithms_give_the_same_answer(spec: str) -> None:
    cfg = RuntimeConfig(job="t", algo=spec)
    n, count = 3, 300_001  # several pipeline segments, uneven chunks

    def body(comm):  # type: ignore[no-untyped-def]
        x = (np.arange(count) % 11 + comm.rank).astype(np.int64)
        if spec.startswith("broadcast"):
            comm.broadcast(x, root=1)
        else:
            comm.reduce(x, root=2)
        return x

    results = run_ranks(n, body, cfg)
    base = np.arange(count) % 11
    if spec.startswith("broadcast"):
        for got in results:
            np.testing.assert_array_equal(got, base + 1)
    else:
        np.testing.assert_array_equal(results[2], 3 * base + 3)
        np.testing.assert_array_equal(results[0], base)  # non-roots keep their input


def test_sequence_numbers_match_across_ranks_and_records_complete() -> None:
    tracers = [RecordingTracer(), RecordingTracer()]

    def body(comm):  # type: ignore[no-untyped-def]
        comm.tracer = tracers[comm.rank]
        x = np.ones(4, dtype=np.float32)
        comm.all_reduce(x)
        comm.broadcast(x, root=1)
        comm.barrier()
        if comm.rank == 0:
            comm.send(x, 1)
        else:
            comm.recv(x, 0)

    run_ranks(2, body)
    seen = [tracer.finished for tracer in tracers]
    for recs in seen:
        assert [(r.op, r.seq, r.state) for r in recs] == [
            ("all_reduce", 1, COMPLETED),
            ("broadcast", 2, COMPLETED),
            ("barrier", 3, COMPLETED),
            ("send" if recs is seen[0] else "recv", 1, COMPLETED),
        ]
        assert all(r.end_ns >= r.start_ns > 0 and r.waiting_on is None for r in recs)
    assert seen[0][0].nbytes == 16 and seen[0][1].root == 1 and seen[0][3].peer == 1


@pytest.mark.parametrize("runner", [run_ranks, shm_run_ranks], ids=["tcp", "shm"])
def test_dtype_mismatch_is_named_on_both_ranks(runner) -> None:  # type: ignore[no-untyped-def]
    """Each rank raises the mismatch as it saw it, or as its peer told it first."""

    def body(comm):  # type: ignore[no-untyped-def]
        dtype = np.float32 if comm.rank == 0 else np.int32
        with pytest.raises((ProtocolError, CommRevoked)) as info:
            comm.all_reduce(np.ones(8, dtype=dtype))
        return str(info.value)

    msgs = runner(2, body, FAST_FAIL)
    assert msgs[0].startswith("rank 0: all_reduce(float32, sum, count 8) seq 1 ")
    assert msgs[1].startswith("rank 1: all_reduce(int32, sum, count 8) seq 1 ")
    for msg in msgs:
        assert (
            "all_reduce(int32, sum, count 8) where" in msg
            or "where rank 1 called all_reduce(int32" in msg
        )
        assert "all_reduce(float32, sum, count 8)" in msg


def test_different_op_fails_fast_and_breaks_the_communicator() -> None:
    def body(comm):  # type: ignore[no-untyped-def]
        x = np.ones(8, dtype=np.float32)
        err: Exception
        try:
            if comm.rank == 0:
                comm.all_reduce(x)
            else:
                comm.broadcast(x, root=0)
        except (ProtocolError, PeerError) as exc:
            err = exc
        else:
            raise AssertionError("a mismatched collective completed")
        with pytest.raises(CommAborted, match="the communicator was revoked"):
            comm.all_reduce(x)
        return type(err).__name__

    kinds = run_ranks(2, body, FAST_FAIL, timeout_s=10)
    assert "ProtocolError" in kinds


def test_failed_call_is_recorded_as_failed() -> None:
    tracer = RecordingTracer()

    def body(comm):  # type: ignore[no-untyped-def]
        if comm.rank == 0:
            comm.tracer = tracer
        with pytest.raises(ProtocolError):
            comm.all_reduce(np.ones(4 + comm.rank, dtype=np.float32))

    run_ranks(2, body, FAST_FAIL)
    records = tracer.finished
    assert records[0].state == FAILED and "count 5" in (records[0].error or "")


def _single_rank(fn):  # type: ignore[no-untyped-def]
    return run_ranks(1, fn)[0]


def test_every_record_carries_its_calls_size() -> None:
    """Records of a size repeated call after call, then of many distinct sizes, each carry
    the count and bytes of their own call."""
    tracer = RecordingTracer()
    counts = [1000] * 10 + list(range(1, 601))

    def body(comm):  # type: ignore[no-untyped-def]
        comm.tracer = tracer
        for n in counts:
            comm.all_reduce(np.ones(n, np.float32) + n)

    _single_rank(body)
    records = tracer.finished
    assert [(r.count, r.nbytes) for r in records] == [(n, 4 * n) for n in counts]


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda c: c.all_reduce([1, 2]), "all_reduce: buf must be a numpy array, got list"),
        (
            lambda c: c.all_reduce(np.ones((4, 4), np.float32)[:, 1]),
            "all_reduce: buf is not contiguous in memory; pass np.ascontiguousarray(x) "
            "(cclctl never silently copies a strided view)",
        ),
        (lambda c: c.all_reduce(np.ones(3, np.complex64)), "all_reduce: buf has dtype complex64"),
        (
            lambda c: c.all_reduce(np.ones(3, np.float32), out=np.ones(3, np.float64)),
            "all_reduce: out has dtype float64 but the input is float32",
        ),
        (
            lambda c: c.all_reduce(np.ones(3, np.float32), out=np.ones(4, np.float32)),
            "all_reduce: out has 4 elements, expected 3",
        ),
        (
            lambda c: c.all_reduce(np.ones(3, np.float32), op="mean"),
            "all_reduce: unknown reduction 'mean'; use one of sum, prod, min, max, avg",
        ),
        (
            lambda c: c.broadcast(np.ones(3, np.float32), root=1),
            "broadcast: root 1 is not a rank of this communicator (0..0)",
        ),
        (
            lambda c: c.all_gather(np.ones(3, np.float32), out=np.ones(2, np.float32)),
            "all_gather: out has 2 elements, expected 3",
        ),
        (lambda c: c.send(np.ones(3, np.float32), 0), "send: rank 0 cannot send to itself"),
    ],
)
def test_bad_input_is_a_clear_error(call, message: str) -> None:  # type: ignore[no-untyped-def]
    def body(comm):  # type: ignore[no-untyped-def]
        with pytest.raises(InvalidArgument) as info:
            call(comm)
        return str(info.value)

    assert _single_rank(body).startswith(message)


def test_read_only_input_is_refused_for_in_place_calls() -> None:
    def body(comm):  # type: ignore[no-untyped-def]
        x = np.ones(3, np.float32)
        x.flags.writeable = False
        out = np.empty_like(x)
        comm.all_reduce(x, out=out)  # out-of-place is fine
        with pytest.raises(InvalidArgument, match="read-only"):
            comm.all_reduce(x)
        return out

    np.testing.assert_array_equal(_single_rank(body), [1, 1, 1])


def test_reduce_scatter_needs_a_multiple_of_the_world_size() -> None:
    def body(comm):  # type: ignore[no-untyped-def]
        with pytest.raises(InvalidArgument, match="not a multiple of the world size 2"):
            comm.reduce_scatter(np.ones(5, np.float32), out=np.ones(2, np.float32))

    run_ranks(2, body)


def test_closed_communicator_refuses_calls() -> None:
    def body(comm):  # type: ignore[no-untyped-def]
        comm.close()
        with pytest.raises(Exception, match="closed communicator"):
            comm.barrier()

    run_ranks(1, body)


@pytest.mark.timeout(120)
def test_sixty_four_ranks() -> None:
    """The largest supported world size, every collective once, uneven counts."""
    n = 64

    def body(comm):  # type: ignore[no-untyped-def]
        r = comm.rank
        small = np.full(3, r, np.int64)
        comm.all_reduce(small)  # recursive doubling
        big = np.full(20_000, r, np.int64)  # 160 KB: the ring
        comm.all_reduce(big)
        gathered = np.empty(2 * n, np.int32)
        comm.all_gather(np.full(2, r, np.int32), gathered)
        scattered = np.empty(1, np.int64)
        comm.reduce_scatter(np.arange(n, dtype=np.int64), scattered)
        swapped = np.empty(n, np.int32)
        comm.all_to_all(np.arange(n, dtype=np.int32) + 100 * r, swapped)
        bcast = np.full(70_000, r, np.int32)  # 280 KB: the pipelined chain
        comm.broadcast(bcast, root=5)
        return small[0], big[-1], gathered, scattered[0], swapped, bcast[-1]

    total = n * (n - 1) // 2
    for r, (small, big, gathered, scattered, swapped, bcast) in enumerate(run_ranks(n, body)):
        assert small == big == total and bcast == 5
        np.testing.assert_array_equal(gathered, np.repeat(np.arange(n), 2))
        assert scattered == n * r
        np.testing.assert_array_equal(swapped, r + 100 * np.arange(n))
