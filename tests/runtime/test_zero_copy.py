"""Shared buffers (``comm.empty()``) and the zero-copy collectives that read them.

The correctness matrix on shared buffers runs in real processes
(``test_runtime_processes.py``); here: what runs zero-copy and what does not, a mix of
shared and plain buffers across ranks, a peer that dies while others read its buffers,
and the buffer registry and peer mappings on their own.
"""

from __future__ import annotations

import gc
import os
from pathlib import Path

import numpy as np
import pytest
from fault_job import FaultJob
from recording_tracer import RecordingTracer
from shm_thread_ranks import run_ranks as shm_run_ranks
from thread_ranks import run_ranks as tcp_run_ranks

from cclctl.config import RuntimeConfig
from cclctl.errors import ProtocolError
from cclctl.runtime.algorithms import zero_copy
from cclctl.runtime.comm import selection
from cclctl.runtime.comm.communicator import Communicator
from cclctl.runtime.transport.shm import shared_buffers
from cclctl.runtime.transport.shm.shared_buffers import Descriptor, PeerBuffers

FAST_FAIL = RuntimeConfig(job="zc", timeout_s=10.0, connect_timeout_s=5.0)


N = selection.ZERO_COPY_MIN_BYTES // 4  # float32/int32 elements: just large enough for zero-copy


def test_collectives_on_shared_buffers_run_zero_copy_and_are_exact() -> None:
    tracers = [RecordingTracer() for _ in range(3)]

    def body(comm: Communicator) -> list[np.ndarray]:
        comm.tracer = tracers[comm.rank]
        r, n = comm.rank, comm.world_size
        a = comm.empty(N, np.int32)
        a[:] = np.arange(N) * (r + 1)
        comm.all_reduce(a)
        g = comm.empty(N * n, np.int32)
        g[N * r : N * (r + 1)] = r
        comm.all_gather(g[N * r : N * (r + 1)], g)
        rs = comm.empty(N, np.int32)
        comm.reduce_scatter(g, rs, op="max")
        b = comm.empty(N, np.float32)
        b[:] = r
        comm.broadcast(b, root=1)
        return [a.copy(), g.copy(), rs.copy(), b.copy()]

    results = shm_run_ranks(3, body)
    for r, (a, g, rs, b) in enumerate(results):
        assert np.array_equal(a, np.arange(N) * 6)
        assert np.array_equal(g, np.repeat(np.arange(3), N))
        assert np.array_equal(rs, np.full(N, r))
        assert np.array_equal(b, np.ones(N))
    for tracer in tracers:
        assert [(rec.op, rec.algo) for rec in tracer.finished] == [
            ("all_reduce", "shm_zero_copy"),
            ("all_gather", "shm_zero_copy"),
            ("reduce_scatter", "shm_zero_copy"),
            ("broadcast", "shm_zero_copy"),
        ]


@pytest.mark.parametrize("in_place", [True, False])
def test_reductions_built_a_piece_at_a_time_are_exact_and_the_same_bits_everywhere(
    in_place: bool,
) -> None:
    """Four ranks (reductions of four inputs run a piece at a time), shares of several
    pieces and a ragged end, in place or not."""
    piece = zero_copy.PIECE_BYTES // 4
    count = 4 * (2 * piece + 123) + 3  # shares of unequal lengths, none a whole piece
    rng = np.random.default_rng(7)
    inputs = [rng.standard_normal(count).astype(np.float32) for _ in range(4)]
    ints = [np.arange(count, dtype=np.int64) * (r + 1) for r in range(4)]

    def body(comm: Communicator) -> tuple[bytes, np.ndarray, np.ndarray, set[str]]:
        r = comm.rank
        comm.tracer = tracer = RecordingTracer()
        a = comm.empty(count, np.float32)
        a[:] = inputs[r]
        out = a if in_place else comm.zeros(count, np.float32)
        comm.all_reduce(a, out=out)
        if not in_place:
            assert np.array_equal(a, inputs[r])  # the input is left alone
        m = comm.empty(count, np.int64)
        m[:] = ints[r]
        comm.all_reduce(m, op="max")
        src = comm.empty(4 * count, np.int64)
        src[:] = np.tile(ints[r], 4)
        rs = comm.empty(count, np.int64)
        comm.reduce_scatter(src, rs)
        return out.tobytes(), m.copy(), rs.copy(), {rec.algo for rec in tracer.finished}

    results = shm_run_ranks(4, body)
    assert len({sums for sums, _, _, _ in results}) == 1  # every rank, the same bits
    total = np.frombuffer(results[0][0], np.float32)
    np.testing.assert_allclose(total, np.sum(inputs, axis=0), rtol=1e-5, atol=1e-5)
    for _, m, rs, algos in results:
        assert np.array_equal(m, ints[3])
        assert np.array_equal(rs, np.arange(count, dtype=np.int64) * 10)
        assert algos == {"shm_zero_copy"}


def test_small_calls_on_shared_buffers_take_the_slot_path_even_when_ranks_mix() -> None:
    """Below MIN_BYTES zero-copy would cost more than it saves; every rank decides from the
    size alone, so shared and plain buffers may mix there."""

    def body(comm: Communicator) -> tuple[str, float]:
        tracer = comm.tracer = RecordingTracer()
        buf = comm.empty(N - 1, np.float32) if comm.rank == 0 else np.empty(N - 1, np.float32)
        buf[:] = 1
        comm.all_reduce(buf)
        return tracer.finished[-1].algo, float(buf[-1])

    assert shm_run_ranks(2, body) == [("shm_direct", 2.0)] * 2


def test_plain_buffers_or_tcp_keep_the_usual_path() -> None:
    """Zero-copy needs shared buffers *and* every rank on one shared-memory host."""

    def body(comm: Communicator) -> tuple[str, float]:
        tracer = comm.tracer = RecordingTracer()
        shared = comm.empty(N, np.float32)
        shared[:] = 1
        comm.all_reduce(shared)
        return tracer.finished[-1].algo, float(shared[0])

    assert tcp_run_ranks(2, body) == [("ring", 2.0)] * 2

    def plain(comm: Communicator) -> str:
        tracer = comm.tracer = RecordingTracer()
        comm.all_reduce(np.ones(N, np.float32))
        return tracer.finished[-1].algo

    assert set(shm_run_ranks(2, plain)) == {"shm_direct"}


def test_shared_buffers_on_one_rank_only_is_a_mismatch_named_on_both() -> None:
    def body(comm: Communicator) -> str:
        buf = comm.empty(N, np.float32) if comm.rank == 0 else np.zeros(N, np.float32)
        with pytest.raises(ProtocolError) as info:
            comm.all_reduce(buf)
        return str(info.value)

    msgs = shm_run_ranks(2, body, FAST_FAIL)
    assert "called all_reduce(" in msgs[0] and "called all_reduce(" in msgs[1]
    assert "shared buffers" in msgs[0] and "shared buffers" in msgs[1]
    assert "comm.empty() on every rank or on none" in msgs[0] + msgs[1]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("op", ["all_reduce", "all_gather", "broadcast"])
def test_a_killed_peer_ends_the_call_with_a_peer_error(tmp_path: Path, op: str) -> None:
    """Rank 1 dies before its third call; rank 0, which waits to read (or be read by) rank
    1, fails at once naming it, instead of hanging or reading freed memory."""
    job = FaultJob(
        tmp_path, 2, fault="kill:rank=1:seq=3", op=op, timeout_s=30, iters=5, pause_s=0.05,
        buffers="shared", hold_on_error=False,
    )  # fmt: skip
    try:
        codes = job.wait_all_exited(30)
        assert codes[1] == -9 and codes[0] == 1, codes
        stderr = job.procs[0].stderr
        assert stderr is not None
        text = stderr.read().decode()
        assert "rank 0 failed" in text and "rank 1" in text and "seq 3" in text, text
    finally:
        job.finish()


def test_the_registry_finds_views_inside_a_buffer_and_forgets_it_when_it_dies() -> None:
    before = set(os.listdir("/dev/shm"))
    buf = shared_buffers.empty((4, 256), np.float64)
    assert buf.shape == (4, 256) and buf.dtype == np.float64
    assert set(os.listdir("/dev/shm")) == before  # a memfd: nothing named, nothing to leak
    row = buf[2]
    desc = shared_buffers.describe(row)
    assert desc is not None
    assert (desc.pid, desc.offset, desc.nbytes) == (os.getpid(), 2 * 256 * 8, 256 * 8)
    assert shared_buffers.describe(np.zeros(4)) is None
    zeroed = shared_buffers.zeros(3000, np.int64)
    assert zeroed.shape == (3000,) and not zeroed.any()
    fd = desc.fd
    assert os.readlink(f"/proc/self/fd/{fd}").startswith(f"/memfd:cclctl-buf-{desc.token} ")
    del buf
    gc.collect()
    assert shared_buffers.describe(row) is not None  # a view keeps the buffer alive
    del row
    gc.collect()
    assert not os.path.exists(f"/proc/self/fd/{fd}") or not os.readlink(
        f"/proc/self/fd/{fd}"
    ).startswith(f"/memfd:cclctl-buf-{desc.token}")


def test_a_buffer_mapped_where_a_dying_one_was_replaces_it_in_the_registry() -> None:
    """Python unmaps an mmap before the finalizer that forgets it runs, and other threads
    may map a new buffer at the same addresses in between (thread ranks did, now and then).
    The new buffer must replace the old one, and the old one's late finalizer must not
    drop the new one."""
    registry = shared_buffers._Registry()
    old = registry.empty(4096, np.uint8)
    before = registry.describe(old)
    assert before is not None
    start = old.__array_interface__["data"][0]
    spare = [os.open(os.devnull, os.O_RDONLY) for _ in range(3)]
    try:
        # a new buffer from the middle of the old range on: the old entry must go
        registry._register(shared_buffers._Buffer(start + 1024, 4096, spare[0], 7))
        inside = registry.describe(old[2048:2100])
        assert inside is not None and (inside.token, inside.offset) == (7, 1024)
        assert registry.describe(old[:100]) is None  # nothing registered there any more
        # one at the very same start replaces that one too
        registry._register(shared_buffers._Buffer(start, 4096, spare[1], 8))
        again = registry.describe(old[:100])
        assert again is not None and (again.token, again.offset) == (8, 0)
        registry._forget(start, spare[2], before.token)  # the old buffer's late finalizer
        spare.pop()
        still = registry.describe(old[:100])
        assert still is not None and still.token == 8
    finally:
        for fd in spare:
            os.close(fd)


def test_peer_buffers_map_read_only_and_refuse_a_wrong_token_or_range() -> None:
    buf = shared_buffers.empty(100, np.int32)
    buf[:] = np.arange(100)
    desc = shared_buffers.describe(buf[10:20])
    assert desc is not None
    peers = PeerBuffers(limit=1)
    try:
        view = peers.array(desc.pack(), np.dtype(np.int32), peer=1)
        assert view.tolist() == list(range(10, 20))
        assert not view.flags.writeable
        forged = Descriptor(desc.pid, desc.fd, desc.token + 1, 0, 4)
        with pytest.raises(ProtocolError, match="not the buffer the peer named"):
            peers.array(forged.pack(), np.dtype(np.int32), peer=1)
        too_far = Descriptor(desc.pid, desc.fd, desc.token, 396, 8)
        with pytest.raises(ProtocolError, match="shared buffer of 400 bytes"):
            peers.array(too_far.pack(), np.dtype(np.int32), peer=1)
        gone = Descriptor(2**22 + 12345, 3, 1, 0, 4)
        with pytest.raises(ProtocolError, match="cannot map peer 1's shared buffer"):
            peers.array(gone.pack(), np.dtype(np.int32), peer=1)
    finally:
        peers.close()
