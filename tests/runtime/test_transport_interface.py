"""The transport interface: the hybrid transport drives any transports that implement it,
and a rank blocked receiving says so (op and direction) on TCP and on shared memory."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pytest
from recording_tracer import RecordingTracer
from shm_thread_ranks import make_transports, run_on
from thread_ranks import make_comms, run_comms

from cclctl.config import RuntimeConfig
from cclctl.errors import CollectiveTimeout, ProtocolError
from cclctl.records import CollectiveRecord
from cclctl.runtime.comm.communicator import Communicator
from cclctl.runtime.transport.base import Transfer, Wait
from cclctl.runtime.transport.drive import MIXED_SLICE_S
from cclctl.runtime.transport.hybrid import HybridTransport
from cclctl.runtime.transport.wire import Call

pytestmark = pytest.mark.timeout(60)
CALL = Call(comm=1, epoch=0, seq=3, op="all_gather", dtype="uint8", count=4)


class Mailbox:
    """What peers have put on one kind of wire: bytes by (src, dst, step)."""

    def __init__(self) -> None:
        self.messages: dict[tuple[int, int, int], bytes] = {}


class FakeShare:
    """A step over a mailbox: sends post at once; a recv completes once its message is
    there. ``block`` delivers the next message held back in ``later`` (a peer's late send,
    on this wire or another)."""

    def __init__(
        self, t: FakeTransport, step: int, sends: Sequence[Transfer], recvs: Sequence[Transfer]
    ):
        self.t, self.step = t, step
        for peer, view in sends:
            t.box.messages[(t.rank, peer, step)] = bytes(view)
        self.recvs = list(recvs)

    @property
    def done(self) -> bool:
        return not self.recvs

    def advance(self) -> bool:
        moved = False
        for peer, view in list(self.recvs):
            msg = self.t.box.messages.pop((peer, self.t.rank, self.step), None)
            if msg is not None:
                view[:] = msg
                self.recvs.remove((peer, view))
                moved = True
        return moved

    def waiting_on(self) -> tuple[int, str]:
        return self.recvs[0][0], "recv"

    def check(self) -> None:
        self.t.log.append(("check", self.t.name))

    def block(self, wait: Wait, peer: int, what: str, slice_s: float | None) -> None:
        self.t.log.append(("block", self.t.name, peer, slice_s))
        wait.check(CALL, peer, what)
        if self.t.later:
            box, key, msg = self.t.later.pop(0)
            box.messages[key] = msg


class FakeTransport:
    """Implements SteppedTransport over a mailbox, and nothing more."""

    def __init__(self, name: str, rank: int, world: int) -> None:
        self.name, self.rank = name, rank
        self.box = Mailbox()
        self.later: list[tuple[Mailbox, tuple[int, int, int], bytes]] = []
        self.log: list[tuple] = []
        self.dropped: list[int] = []
        self.closed = False
        self.sent, self.received = [0] * world, [0] * world

    def start(
        self,
        call: Call,
        step: int,
        sends: Sequence[Transfer],
        recvs: Sequence[Transfer],
        wait: Wait,
    ) -> FakeShare:
        for peer, view in sends:
            self.sent[peer] += len(view)
        for peer, view in recvs:
            self.received[peer] += len(view)
        return FakeShare(self, step, sends, recvs)

    def exchange(
        self,
        call: Call,
        step: int,
        sends: Sequence[Transfer],
        recvs: Sequence[Transfer],
        wait: Wait,
    ) -> None:
        raise AssertionError("the hybrid drives its parts' steps; it never calls exchange")

    def drop_link(self, peer: int) -> None:
        self.dropped.append(peer)

    def link_bytes(self) -> tuple[list[int], list[int]]:
        return list(self.sent), list(self.received)

    def close(self) -> None:
        self.closed = True


def _wait() -> Wait:
    return Wait(rank=0, record=CollectiveRecord("c", 3, "all_gather"), deadline=math.inf)


def test_the_hybrid_routes_each_peer_to_its_transport_and_drives_both() -> None:
    near, far = FakeTransport("near", 0, 4), FakeTransport("far", 0, 4)
    hybrid = HybridTransport(near, far, [0, 2], hierarchy=None)
    near.box.messages[(2, 0, 5)] = b"from2"  # already there
    far.later = [(far.box, (1, 0, 5), b"from1"), (far.box, (3, 0, 5), b"from3")]
    got = {p: bytearray(5) for p in (1, 2, 3)}
    sends = [(p, memoryview(b"to-%d!" % p)) for p in (1, 2, 3)]
    hybrid.exchange(CALL, 5, sends, [(p, memoryview(got[p])) for p in (1, 2, 3)], _wait())
    assert {p: bytes(v) for p, v in got.items()} == {1: b"from1", 2: b"from2", 3: b"from3"}
    assert near.box.messages == {(0, 2, 5): b"to-2!"}
    assert far.box.messages == {(0, 1, 5): b"to-1!", (0, 3, 5): b"to-3!"}
    # near finished at once, so the far side blocked alone, its own way.
    assert [e for e in far.log if e[0] == "block"] == [("block", "far", p, None) for p in (1, 3)]
    sent, received = hybrid.link_bytes()
    assert sent == [0, 5, 5, 5] and received == [0, 5, 5, 5]
    hybrid.drop_link(2)
    hybrid.drop_link(3)
    assert (near.dropped, far.dropped) == ([2], [3])
    hybrid.close()
    assert near.closed and far.closed


def test_the_hybrid_polls_the_far_side_briefly_while_the_near_side_waits_too() -> None:
    near, far = FakeTransport("near", 0, 3), FakeTransport("far", 0, 3)
    hybrid = HybridTransport(near, far, [0, 1], hierarchy=None)
    # While the hybrid is blocked on the far side, the near peer's message lands, then
    # the far peer's: the near share is only checked, never slept on, beside sockets.
    far.later = [(near.box, (1, 0, 0), b"x"), (far.box, (2, 0, 0), b"y")]
    wait = _wait()
    a, b = bytearray(1), bytearray(1)
    hybrid.exchange(CALL, 0, [], [(1, memoryview(a)), (2, memoryview(b))], wait)
    assert (bytes(a), bytes(b)) == (b"x", b"y")
    assert near.log == [("check", "near")]
    assert far.log == [("block", "far", 2, MIXED_SLICE_S), ("block", "far", 2, None)]
    assert wait.record is not None and (wait.record.waiting_on, wait.record.waiting_for) == (
        2,
        "recv",
    )


def test_without_local_peers_the_hybrid_is_its_far_transport() -> None:
    far = FakeTransport("far", 0, 2)
    hybrid = HybridTransport(None, far, [], hierarchy=None)
    far.box.messages[(1, 0, 0)] = b"z"
    got = bytearray(1)
    hybrid.exchange(CALL, 0, [(1, memoryview(b"w"))], [(1, memoryview(got))], _wait())
    assert bytes(got) == b"z" and far.box.messages == {(0, 1, 0): b"w"}


def _blocked_recv(comm: Communicator, tracer: RecordingTracer) -> str:
    if comm.rank == 0:
        return ""
    comm.tracer = tracer
    with pytest.raises(CollectiveTimeout) as info:
        comm.recv(np.zeros(4, np.float32), 0)
    assert info.value.fields["op"] == "recv" and info.value.fields["waiting_for"] == "recv"
    return str(info.value)


@pytest.mark.parametrize("kind", ["tcp", "shm"])
def test_a_rank_blocked_receiving_reports_recv(kind: str) -> None:
    cfg = RuntimeConfig(job="blocked-recv", timeout_s=0.5, connect_timeout_s=5.0)
    tracer = RecordingTracer()
    if kind == "tcp":
        msgs = run_comms(make_comms(2, cfg), lambda c: _blocked_recv(c, tracer))
    else:
        msgs = run_on(make_transports(2), lambda c: _blocked_recv(c, tracer), cfg)
    assert msgs[1].startswith("rank 1: recv seq 1 timed out")
    assert "waiting to recv from rank 0" in msgs[1]
    [rec] = tracer.started
    assert (rec.op, rec.waiting_on, rec.waiting_for) == ("recv", 0, "recv")


def _send_recv(comm: Communicator, count: int) -> str:
    if comm.rank == 0:
        comm.send(np.arange(4, dtype=np.uint8), 1)
        return ""
    got = np.zeros(count, np.uint8)
    try:
        comm.recv(got, 0)
    except ProtocolError as exc:
        return str(exc)
    return got.tobytes().hex()


@pytest.mark.parametrize("kind", ["tcp", "shm"])
def test_a_send_and_its_recv_match_and_a_mismatch_names_the_recv(kind: str) -> None:
    def run(count: int) -> str:
        if kind == "tcp":
            return str(run_comms(make_comms(2), lambda c: _send_recv(c, count))[1])
        return str(run_on(make_transports(2), lambda c: _send_recv(c, count))[1])

    assert run(4) == bytes(range(4)).hex()
    msg = run(8)
    assert "rank 1 called recv(uint8, count 8)" in msg
    assert "rank 0 called send(uint8, count 4)" in msg
