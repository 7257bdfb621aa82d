"""The shared-memory transport on thread ranks: results, bit-identity, mismatches, failures."""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np
import pytest
from recording_tracer import RecordingTracer
from shm_thread_ranks import CFG, make_transports, run_on, run_ranks

from cclctl.errors import CollectiveTimeout, CommAborted, CommRevoked, PeerError, ProtocolError
from cclctl.runtime.algorithms.context import Step
from cclctl.runtime.comm.communicator import Communicator
from cclctl.runtime.transport.base import Wait
from cclctl.runtime.transport.hybrid import HybridTransport
from cclctl.runtime.transport.shm.host_peers import HostPeers
from cclctl.runtime.transport.shm.layout import Layout
from cclctl.runtime.transport.shm.transport import ShmTransport

pytestmark = pytest.mark.timeout(60)
FAST_FAIL = CFG.replace(timeout_s=3.0)


def tiny(local_size: int) -> Layout:
    """Slots of 4 KiB, two of each: every collective runs many rounds and reuses slots."""
    return Layout(local_size, slots=2, slot_bytes=4096, p2p_slots=2, p2p_bytes=4096)


def every_collective(comm: Communicator, count: int) -> dict[str, np.ndarray]:
    r, n = comm.rank, comm.world_size
    x = ((np.arange(count) * 7 + r * 3) % 11 + 1).astype(np.int64)
    got: dict[str, np.ndarray] = {}
    y = x.copy()
    comm.all_reduce(y, op="max" if count % 2 else "sum")
    got["all_reduce"] = y
    got["all_reduce_out"] = comm.all_reduce(x, out=np.empty_like(x), op="prod")
    got["all_gather"] = comm.all_gather(x, np.empty(count * n, np.int64))
    got["reduce_scatter"] = comm.reduce_scatter(np.tile(x, n) + r, np.empty(count, np.int64))
    b = x.copy()
    comm.broadcast(b, root=n - 1)
    got["broadcast"] = b
    red = x.copy()
    comm.reduce(red, root=0)
    got["reduce"] = red
    got["all_to_all"] = comm.all_to_all(np.tile(x, n) + r, np.empty(count * n, np.int64))
    comm.barrier()
    return got


def expected(n: int, count: int, rank: int) -> dict[str, np.ndarray]:
    xs = [((np.arange(count) * 7 + r * 3) % 11 + 1).astype(np.int64) for r in range(n)]
    want = {
        "all_reduce": np.max(xs, axis=0) if count % 2 else np.sum(xs, axis=0),
        "all_reduce_out": np.prod(xs, axis=0),
        "all_gather": np.concatenate(xs),
        "reduce_scatter": np.sum(xs, axis=0) + sum(range(n)),
        "broadcast": xs[n - 1],
        "all_to_all": np.concatenate([xs[j] + j for j in range(n)]),
    }
    if rank == 0:
        want["reduce"] = np.sum(xs, axis=0)
    return want


@pytest.mark.parametrize(
    ("n", "hosts", "one_copy"),
    [
        (2, None, True),
        (3, None, True),
        (4, None, True),
        (3, None, False),  # every collective through the point-to-point rings
        (4, ["a", "a", "b", "b"], True),  # hybrid: hierarchical all-reduce
        (3, ["a", "b", "a"], True),  # hybrid, hosts interleaved
        (3, ["a", "a", "b"], True),  # hybrid, rank 2 alone on its host
        (3, ["a", "b", "c"], True),  # one rank per host: plain TCP
    ],
)
def test_every_collective_matches_numpy_through_many_slot_rounds(
    n: int, hosts: list[str] | None, one_copy: bool
) -> None:
    transports = make_transports(n, hosts, layout=tiny, one_copy=one_copy)
    counts = [1, 5, 1000, 2999]  # 2999 int64s: 6 rounds of 4 KiB, slots reused 3 times

    def body(comm: Communicator) -> list[dict[str, np.ndarray]]:
        return [every_collective(comm, c) for c in counts]

    # From 1 KiB up the bandwidth algorithms run: reduce-scatter + all-gather, chains.
    cfg = CFG.replace(algo="all_reduce>=1K=ring,broadcast>=1K=chain,reduce>=1K=ring")
    results = run_on(transports, body, cfg)
    for rank, per_count in enumerate(results):
        for count, got in zip(counts, per_count, strict=True):
            for name, want in expected(n, count, rank).items():
                np.testing.assert_array_equal(got[name], want, err_msg=f"{name} count {count}")


@pytest.mark.parametrize("n", [3, 5])
@pytest.mark.parametrize("count", [10, 300_007])  # direct, and reduce-scatter + all-gather
def test_float_all_reduce_is_bit_identical_on_every_rank(n: int, count: int) -> None:
    rng = np.random.default_rng(1)
    inputs = [rng.standard_normal(count).astype(np.float32) for _ in range(n)]

    def body(comm: Communicator) -> np.ndarray:
        return comm.all_reduce(inputs[comm.rank].copy())

    results = run_ranks(n, body)
    for got in results[1:]:
        assert got.tobytes() == results[0].tobytes()
    np.testing.assert_allclose(results[0], np.sum(inputs, axis=0), rtol=1e-5, atol=1e-5)


def test_records_name_the_shared_memory_algorithm() -> None:
    tracer = RecordingTracer()

    def body(comm: Communicator) -> None:
        if comm.rank == 0:
            comm.tracer = tracer
        comm.all_reduce(np.ones(4, np.float32))
        comm.all_reduce(np.ones(3 << 20, np.float32))  # 12 MiB: several rounds

    run_ranks(3, body, cross_memory=False)
    seen = [r for r in tracer.finished if r.peer is None]
    assert [r.algo for r in seen] == ["shm_direct", "shm_rsag"]
    assert seen[1].step > 0  # it ran several rounds


@pytest.mark.parametrize("one_copy", [True, False])
def test_different_op_fails_fast_and_breaks_the_communicator(one_copy: bool) -> None:
    """Fast: the mismatch itself fails the call (a CollectiveTimeout, what waiting for the
    deadline would give, is neither of the errors expected)."""

    def body(comm: Communicator) -> tuple[str, str]:
        x = np.ones(8, dtype=np.float32)
        with pytest.raises((ProtocolError, PeerError, CommRevoked)) as info:
            if comm.rank == 0:
                comm.all_reduce(x)
            else:
                comm.broadcast(x, root=0)
        with pytest.raises(CommAborted, match="the communicator was revoked"):
            comm.all_reduce(x)
        return type(info.value).__name__, str(info.value)

    transports = make_transports(2, one_copy=one_copy)
    errors = dict(run_on(transports, body, FAST_FAIL))
    assert "ProtocolError" in errors
    mismatch = errors["ProtocolError"]
    assert "all_reduce(float32, sum, count 8)" in mismatch and "broadcast(" in mismatch, mismatch
    assert "broadcast(float32, root 0, count 8)" in mismatch and "all_reduce(float32" in mismatch


def test_a_rank_that_never_comes_times_out_naming_it() -> None:
    """The first waiting rank to expire times out naming rank 2; the other times out too,
    or, where the first's failure reached it before its own deadline, raises that failure,
    whose origin is rank 2."""
    transports = make_transports(3)
    tracer = RecordingTracer()
    records = tracer.started

    def body(comm: Communicator) -> str:
        if comm.rank == 2:
            return "skipped"
        comm.tracer = tracer
        with pytest.raises((CollectiveTimeout, CommRevoked)) as info:
            comm.all_reduce(np.ones(4, np.float32))
        if isinstance(info.value, CommRevoked):
            rev = info.value.revocation
            assert rev is not None and rev.origin == 2, info.value
            return f"revoked: {info.value}"
        return f"timed out: {info.value}"

    cfg = CFG.replace(timeout_s=0.5)
    msgs = run_on(transports, body, cfg)[:2]
    assert any(m.startswith("timed out: ") for m in msgs), msgs
    for msg in msgs:
        timed_out = msg.startswith("timed out: ") and "waiting to recv from rank 2" in msg
        assert timed_out or "rank 2 did not answer" in msg, msgs
    assert {(r.waiting_on, r.waiting_for) for r in records} == {(2, "recv")}


def _after_a_close(
    transports: list[Any],
    closer: int,
    count: int,
    errors: type[Exception] | tuple[type[Exception], ...],
) -> list[str]:
    """Rank ``closer`` closes; then every other rank's all_reduce of ``count`` elements
    fails at once with one of ``errors`` (not the CollectiveTimeout of waiting): their
    messages, by rank (the closer's empty)."""
    closed = threading.Event()

    def body(comm: Communicator) -> str:
        if comm.rank == closer:
            comm.close()
            closed.set()
            return ""
        assert closed.wait(10)
        with pytest.raises(errors) as info:
            comm.all_reduce(np.ones(count, np.float32))
        return str(info.value)

    return run_on(transports, body, FAST_FAIL)


def test_a_peer_that_closes_fails_the_waiting_rank_at_once() -> None:
    msg = _after_a_close(make_transports(2), closer=1, count=4, errors=PeerError)[0]
    assert "link between rank 0 and rank 1 broke" in msg and "closed its communicator" in msg


@pytest.mark.parametrize("one_copy", [True, False])
def test_a_peer_that_closes_without_entering_fails_every_waiting_rank_at_once(
    one_copy: bool,
) -> None:
    """4 ranks: rank 0 closes; the others' all_reduce fails at once, naming rank 0, on the
    ranks that wait on it and, through their failure, on those that wait on them."""
    transports = make_transports(4, one_copy=one_copy)
    msgs = _after_a_close(transports, closer=0, count=1 << 16, errors=(PeerError, CommRevoked))
    for msg in msgs[1:]:
        assert "link between rank 0 and rank" in msg and "closed its communicator" in msg, msg


def test_a_peer_that_answered_then_closed_does_not_fail_the_waiting_rank(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Rank 0 blocks on rank 1's input; rank 1 then publishes it, completes the call and
    closes before rank 0 looks at its peers again (as a loaded machine orders it): what rank
    1 left is there to read, so rank 0's call completes, exact."""
    transports = make_transports(2)
    blocked, closed = threading.Event(), threading.Event()
    check = Wait.check

    def held(self: Wait, call: Any, peer: int, what: str) -> float:
        if self.rank == 0 and not blocked.is_set():
            blocked.set()
            assert closed.wait(10), "rank 1 never closed"
        return check(self, call, peer, what)

    monkeypatch.setattr(Wait, "check", held)

    def body(comm: Communicator) -> list[float]:
        buf = np.full(4, comm.rank + 1, np.float32)
        if comm.rank == 1:
            assert blocked.wait(10), "rank 0 never blocked"
            comm.all_reduce(buf)
            comm.close()
            closed.set()
        else:
            comm.all_reduce(buf)
        return [float(x) for x in buf]

    assert run_on(transports, body, FAST_FAIL) == [[3.0] * 4, [3.0] * 4]


def test_a_rank_that_completed_and_closed_does_not_fail_a_rank_still_finishing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A 3-rank all_to_all through the point-to-point rings: rank 0 completes it and closes
    while rank 1 still waits for rank 2's block (rank 2 is held before its last step until
    rank 1 has looked at its peers with rank 0 closed). Rank 0 owes rank 1 nothing more, so
    rank 1 goes on waiting, and every rank's result is exact."""
    transports = make_transports(3, one_copy=False)
    closed, looked = threading.Event(), threading.Event()
    check, xfer = HostPeers.check_peers, Step.xfer

    def checked(self: HostPeers, *args: Any) -> None:
        check(self, *args)
        if self.rank == 1 and closed.is_set():
            looked.set()

    def held(self: Step, step: int, *args: Any, **kwargs: Any) -> None:
        if self.rank == 2 and step == 2:
            looked.wait(10)  # rank 1 fails there on the code before: go on either way
        xfer(self, step, *args, **kwargs)

    monkeypatch.setattr(HostPeers, "check_peers", checked)
    monkeypatch.setattr(Step, "xfer", held)

    def body(comm: Communicator) -> list[int]:
        r = comm.rank
        got = comm.all_to_all(np.arange(3, dtype=np.int64) + 10 * r, np.empty(3, np.int64))
        if r == 0:
            comm.close()
            closed.set()
        return [int(x) for x in got]

    assert run_on(transports, body, FAST_FAIL) == [[j * 10 + r for j in range(3)] for r in range(3)]
    assert looked.is_set()


def test_an_abort_ends_a_blocked_wait() -> None:
    """Rank 1 never joins (its communicator stays open until every rank returns); the abort
    comes once rank 0's all_reduce is blocked waiting on it."""
    transports = make_transports(2)
    tracer = RecordingTracer()

    def abort_once_blocked(comm: Communicator) -> None:
        deadline = time.monotonic() + 10
        while not (tracer.started and tracer.started[-1].waiting_on == 1):
            assert time.monotonic() < deadline, "rank 0 never blocked on rank 1"
            time.sleep(0.005)
        comm.abort("operator said so")

    def body(comm: Communicator) -> str:
        if comm.rank == 1:
            return ""
        comm.tracer = tracer
        aborter = threading.Thread(target=abort_once_blocked, args=(comm,), daemon=True)
        aborter.start()
        with pytest.raises(CommAborted, match="operator said so"):
            comm.all_reduce(np.ones(4, np.float32))
        aborter.join(10)
        return "aborted"

    assert run_on(transports, body, CFG)[0] == "aborted"


def test_transports_and_link_bytes() -> None:
    shm = make_transports(2)
    hybrid = make_transports(4, ["a", "a", "b", "b"])

    def body(comm: Communicator) -> tuple[list[int], list[int]]:
        x = np.zeros(100, np.uint8)
        if comm.rank == 0:
            comm.send(x, 1)
        elif comm.rank == 1:
            comm.recv(x, 0)
        return comm.transport.link_bytes()

    assert all(isinstance(t, ShmTransport) for t in shm)
    assert all(isinstance(t, HybridTransport) for t in hybrid)
    counts = run_on(hybrid, body)
    assert counts[0][0][1] == 100 and counts[1][1][0] == 100


def test_a_dropped_link_fails_both_ranks() -> None:
    def body(comm: Communicator) -> str:
        x = np.ones(4, np.float32)
        comm.all_reduce(x)
        if comm.rank == 0:
            comm.transport.drop_link(1)
        with pytest.raises((PeerError, CommRevoked)) as info:
            comm.all_reduce(x)
        return str(info.value)

    msgs = run_ranks(2, body, FAST_FAIL)
    assert msgs[0] == (  # the rank that dropped it says so
        "rank 0: all_reduce(float32, sum, count 4) seq 2 failed: "
        "link between rank 0 and rank 1 broke (the link was dropped, seen by rank 0)"
    )
    assert msgs[1] == (  # its peer names that link, as rank 0 saw it
        "rank 1: all_reduce(float32, sum, count 4) seq 2 revoked: "
        "link between rank 0 and rank 1 broke (the link was dropped, seen by rank 0)"
    )


def test_one_copy_collectives_count_link_bytes_both_ways() -> None:
    def body(comm: Communicator) -> tuple[list[int], list[int]]:
        comm.all_reduce(np.ones(250, np.float32))  # 1000 bytes read from the peer
        comm.broadcast(np.ones(100, np.uint8), root=1)  # 100 bytes from rank 1
        return comm.transport.link_bytes()

    (sent0, received0), (sent1, received1) = run_ranks(2, body)
    assert (sent0, received0) == ([0, 1000], [0, 1100])
    assert (sent1, received1) == ([1100, 0], [1000, 0])


@pytest.mark.parametrize("op", ["sum", "max", "min", "prod"])
@pytest.mark.parametrize("in_place", [True, False])
@pytest.mark.parametrize(("cross_memory", "algo"), [(False, "shm_rsag"), (True, "shm_cma")])
def test_two_ranks_reduce_half_each_and_every_rank_gets_the_rank_order_bits(
    op: str, in_place: bool, cross_memory: bool, algo: str
) -> None:
    """From 1 MiB, 2 ranks run ``shm_rsag``: each reduces its half from its own buffer and
    the peer's slot, and copies the other half; or ``shm_cma``: each reads the peer's half
    through the kernel, reduces it and writes it into the peer's output. Every rank's
    result has the bits of
    ``op(rank 0's input, rank 1's input)``, signed zeros and NaNs included (which an
    order-dependent ``min``/``max`` would change), and ``src`` of an out-of-place call
    stays intact."""
    count = 300_007  # 1.2 MiB of float32: two rounds of the 1 MiB slot, odd halves
    rng = np.random.default_rng(7)
    inputs = [rng.standard_normal(count).astype(np.float32) for _ in range(2)]
    inputs[0][::5], inputs[1][::5] = np.float32(0.0), np.float32(-0.0)
    inputs[0][3::7] = np.float32(np.nan)
    fn = {"sum": np.add, "max": np.maximum, "min": np.minimum, "prod": np.multiply}[op]
    want = fn(inputs[0], inputs[1])
    tracer = RecordingTracer()

    def body(comm: Communicator) -> tuple[bytes, bool]:
        if comm.rank == 0:
            comm.tracer = tracer
        src = inputs[comm.rank].copy()
        if in_place:
            comm.all_reduce(src, op=op)
            return src.tobytes(), True
        got = comm.all_reduce(src, out=np.empty_like(src), op=op)
        return got.tobytes(), src.tobytes() == inputs[comm.rank].tobytes()

    results = run_ranks(2, body, cross_memory=cross_memory)
    assert [r.algo for r in tracer.finished if r.peer is None] == [algo]
    for got, src_intact in results:
        assert got == want.tobytes()
        assert src_intact
