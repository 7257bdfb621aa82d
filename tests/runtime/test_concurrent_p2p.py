"""Point-to-point calls on two threads of one rank at once (as the torch backend's lanes run
them): a send and a receive with the same peer move together, each pair's seq kept, a
failed call's error names that call, not the other one open beside it, and a rank's wake
flag stays up while any of its threads sleeps, and a TCP revoke frame is never written
while another thread's step may be mid-message."""

from __future__ import annotations

import socket
import threading

import numpy as np
import pytest
from recording_tracer import RecordingTracer
from shm_thread_ranks import run_ranks as shm_run_ranks
from thread_ranks import run_ranks

from cclctl.config import RuntimeConfig
from cclctl.errors import CclError
from cclctl.records import COMPLETED, CollectiveRecord
from cclctl.revocation import Revocation
from cclctl.runtime.transport.shm.layout import W_SLEEPING
from cclctl.runtime.transport.tcp.transport import TcpTransport

pytestmark = pytest.mark.timeout(60)
FAST_FAIL = RuntimeConfig(job="t", timeout_s=10.0, connect_timeout_s=5.0)
COUNT = 4 << 20  # 16 MiB of int32: far beyond what either transport buffers


def _payload(sender: int, k: int) -> np.ndarray:
    return np.arange(COUNT, dtype=np.int32) * (sender + 2) + k


@pytest.mark.parametrize("runner", [run_ranks, shm_run_ranks], ids=["tcp", "shm"])
def test_a_send_and_a_receive_with_one_peer_run_at_once_on_two_threads(runner) -> None:  # type: ignore[no-untyped-def]
    tracers = [RecordingTracer(), RecordingTracer()]

    def body(comm):  # type: ignore[no-untyped-def]
        comm.tracer = tracers[comm.rank]
        peer, exact = 1 - comm.rank, []
        for k in range(3):  # both ranks send first: on one thread, both would block
            got = np.zeros(COUNT, np.int32)
            sending = threading.Thread(target=comm.send, args=(_payload(comm.rank, k), peer))
            sending.start()
            comm.recv(got, peer)
            sending.join()
            exact.append(bool(np.array_equal(got, _payload(peer, k))))
        return exact

    assert runner(2, body, FAST_FAIL) == [[True] * 3] * 2
    for rank, tracer in enumerate(tracers):
        seen = sorted((r.op, r.peer, r.seq, r.state) for r in tracer.finished)
        peer = 1 - rank
        want = [(op, peer, seq, COMPLETED) for op in ("recv", "send") for seq in (1, 2, 3)]
        assert seen == want


def test_a_failed_receive_names_itself_while_a_send_opened_after_it_is_in_flight() -> None:
    recv_open, send_open = threading.Event(), threading.Event()

    def opened(rec: CollectiveRecord) -> None:
        (recv_open if rec.op == "recv" else send_open).set()

    def body(comm):  # type: ignore[no-untyped-def]
        if comm.rank == 0:
            assert send_open.wait(30)
            comm.send(np.ones(8, np.float32), 1)  # what rank 1 receives as int32
            return ""
        comm.tracer = RecordingTracer(opened)
        errors: list[str] = []

        def receive() -> None:
            try:
                comm.recv(np.zeros(8, np.int32), 0)
            except CclError as exc:
                errors.append(str(exc))

        receiving = threading.Thread(target=receive)
        receiving.start()
        assert recv_open.wait(30)
        with pytest.raises(CclError):
            comm.send(np.ones(COUNT, np.int32), 0)  # opened last; fails with the receive
        receiving.join()
        return errors[0]

    _, message = shm_run_ranks(2, body, FAST_FAIL)
    assert message.startswith("rank 1: recv(int32, count 8) seq 1 failed: "), message


def test_a_ranks_wake_flag_stays_up_while_any_of_its_threads_sleeps() -> None:
    """Peers wake a rank's sleepers only while its flag is up: a send and a receive asleep
    on two threads at once must not take it down for each other (the other would sleep a
    full slice unwoken)."""

    def body(comm):  # type: ignore[no-untyped-def]
        peers = comm.transport.group.peers
        flags = []
        peers._asleep(1)  # two threads enter block() ...
        peers._asleep(1)
        peers.me.i[W_SLEEPING] = 1  # ... and raise the flag, as each does in its loop
        peers._asleep(-1)  # one wakes: the other still sleeps
        flags.append(int(peers.me.i[W_SLEEPING]))
        peers._asleep(-1)
        flags.append(int(peers.me.i[W_SLEEPING]))
        return flags

    assert shm_run_ranks(2, body) == [[1, 0], [1, 0]]


class _Links:
    """Just what TcpTransport.announce touches: one open link, no MAC."""

    rank, world_size = 0, 2

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.dropped = False

    def open_links(self) -> list[tuple[int, socket.socket]]:
        return [] if self.dropped else [(1, self.sock)]

    def session(self, peer: int) -> None:
        return None

    def drop_all(self) -> None:
        self.dropped = True


class _Step:
    def __init__(self, done: bool) -> None:
        self.done, self.pending = done, []


@pytest.mark.parametrize("other_in_flight", [False, True])
def test_a_revoke_frame_goes_out_only_while_no_other_threads_step_is_in_flight(
    other_in_flight: bool,
) -> None:
    """Another thread's step may be mid-message on any link: a frame there would land in
    the middle of its message, so the announce only closes the links then."""
    here, there = socket.socketpair()
    with here, there:
        links = _Links(here)
        transport = TcpTransport(links)  # type: ignore[arg-type]
        transport._live[-1] = _Step(done=not other_in_flight)  # type: ignore[assignment]
        transport.announce("broken", Revocation("died", 1, "gone", comm="0:0-1"))
        there.setblocking(False)
        try:
            got = there.recv(4096)
        except BlockingIOError:
            got = b""
        assert links.dropped and (got == b"") == other_in_flight
