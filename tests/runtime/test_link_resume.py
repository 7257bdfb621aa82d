"""A TCP link that a reset ends mid-step is made again in the step and its lost message sent
again whole, so nothing re-runs; where a message was lost past resending, or the peer closed
the link for good, the step fails as before and the retry takes over.

Two thread ranks on loopback drive real TCP transports; the test ends a connection with
``shutdown`` on one side (a reset's effect on the socket: the next send fails, the peer
reads an end) at a point the test chooses.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import threading
from collections.abc import Callable

import numpy as np
import pytest

from cclctl.config import RuntimeConfig
from cclctl.errors import PeerError, ProtocolError
from cclctl.runtime.comm.communicator import Communicator, world_comm_id
from cclctl.runtime.transport import wire
from cclctl.runtime.transport.base import Wait
from cclctl.runtime.transport.tcp.links import Links
from cclctl.runtime.transport.tcp.messages import Send
from cclctl.runtime.transport.tcp.resume import Cursor, from_tail, lost, problem, resend
from cclctl.runtime.transport.tcp.step_resume import TAIL_MIN_BYTES
from cclctl.runtime.transport.tcp.transport import TcpTransport

pytestmark = pytest.mark.timeout(60)

TOKEN = "the-job-token-for-these-tests-0123456789"
JOB = "resume-test"
BIG = 32 << 20  # far more than the sockets' buffers hold: the send is mid-message for long


def _pair(mac: bool = False, resume_s: float = 10.0) -> tuple[list[Links], list[TcpTransport]]:
    links = [
        Links(r, 2, JOB, "127.0.0.1", 10.0, token=TOKEN, mac=mac, resume_s=resume_s)
        for r in range(2)
    ]
    for one in links:
        one.peers = [x.address for x in links]
    return links, [TcpTransport(one) for one in links]


def _call(seq: int, count: int) -> wire.Call:
    return wire.Call(comm=7, epoch=0, seq=seq, op="all_reduce", dtype="uint8", count=count)


def _payload(rank: int, n: int) -> np.ndarray:
    return np.random.default_rng(rank).integers(0, 256, n, dtype=np.uint8)


class Rank(threading.Thread):
    """One rank's step on a thread of its own: its error, if it raised one."""

    def __init__(self, body: Callable[[], None]) -> None:
        super().__init__(daemon=True)
        self.body = body
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.body()
        except BaseException as exc:
            self.error = exc


def _exchange(t: TcpTransport, peer: int, call: wire.Call, step: int, send: np.ndarray | None,
              recv: np.ndarray | None, settled: bool = False) -> Callable[[], None]:  # fmt: skip
    """``settled``: the call says its send buffer stays as sent (``Wait.settled``)."""
    sends = [] if send is None else [(peer, send.data.cast("B"))]
    recvs = [] if recv is None else [(peer, recv.data.cast("B"))]
    span = None
    if settled and send is not None:
        span = (send.ctypes.data, send.ctypes.data + send.nbytes)
    return lambda: t.exchange(call, step, sends, recvs, Wait(rank=t.rank, settled=span))


def _link(ts: list[TcpTransport]) -> None:
    """One 8-byte exchange at seq 1: the pair is linked, one message each way."""
    got = [np.zeros(8, np.uint8) for _ in range(2)]
    ranks = [Rank(_exchange(ts[r], 1 - r, _call(1, 8), 0, _payload(r, 8), got[r]))
             for r in range(2)]  # fmt: skip
    for r in ranks:
        r.start()
    for r in ranks:
        r.join(20)
        assert r.error is None, r.error


def _wait_until(done: Callable[[], bool], what: str) -> None:
    """Until ``done()`` (a state the ranks reach), failing after 20 s."""
    ev = threading.Event()
    for _ in range(2000):
        if done():
            return
        ev.wait(0.01)
    raise AssertionError(f"never saw {what}")


def _mid_send(t: TcpTransport) -> bool:
    step = t._step
    return step is not None and any(isinstance(p, Send) and p.begun for p in step.pending)


def _close(transports: list[TcpTransport]) -> None:
    for t in transports:
        t.close()


def _reset(sock: socket.socket) -> None:
    """``ss -K`` on ``sock``'s connection, this side only: the kernel destroys the socket
    with what it had received, and the peer gets a reset."""
    (lhost, lport), (rhost, rport) = sock.getsockname(), sock.getpeername()
    subprocess.run(
        ["ss", "-K", "-tn", "src", f"{lhost}:{lport}", "dst", f"{rhost}:{rport}"],
        check=True, capture_output=True, timeout=10,
    )  # fmt: skip


@pytest.mark.parametrize("mac", [False, True], ids=["plain", "mac"])
def test_a_connection_ended_mid_message_is_made_again_and_the_message_sent_again(
    mac: bool,
) -> None:
    links, ts = _pair(mac=mac)
    try:
        _link(ts)
        data = [_payload(r, BIG) for r in range(2)]
        got = [np.zeros(BIG, np.uint8) for _ in range(2)]
        first = Rank(_exchange(ts[0], 1, _call(2, BIG), 0, data[0], got[0]))
        first.start()
        _wait_until(lambda: _mid_send(ts[0]), "rank 0 mid send")
        links[0].socks[1].shutdown(socket.SHUT_RDWR)  # its connection ends mid message
        second = Rank(_exchange(ts[1], 0, _call(2, BIG), 0, data[1], got[1]))
        second.start()
        for r in (first, second):
            r.join(40)
            assert r.error is None, r.error
        assert np.array_equal(got[0], data[1]) and np.array_equal(got[1], data[0])
        assert links[0].resumed == [0, 1] and links[1].resumed == [1, 0]
    finally:
        _close(ts)


def _tail_left_in_the_queue(
    links: list[Links], ts: list[TcpTransport], settled: bool = False
) -> tuple[np.ndarray, int]:
    """Link the pair, then have rank 0 send a message larger than rank 1's receive buffer
    but within the two buffers, while rank 1 reads nothing: rank 0's step ends with the
    message's tail in its send queue. Returns the message and its size."""
    _link(ts)
    rcvbuf = links[1].socks[0].getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)
    sndbuf = links[0].socks[1].getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)
    n = rcvbuf + sndbuf // 4
    if n < TAIL_MIN_BYTES:
        pytest.skip(f"socket buffers of {rcvbuf} and {sndbuf} bytes: no message both fits "
                    "them and keeps a tail")  # fmt: skip
    message = _payload(0, n)
    only = Rank(_exchange(ts[0], 1, _call(2, n), 0, message, None, settled))
    only.start()
    only.join(20)
    assert only.error is None and links[0].started[1] == 2, only.error
    return message, n


needs_ss = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("ss"), reason="needs root and ss"
)


@pytest.mark.parametrize("settled", [False, True], ids=["copied", "settled"])
def test_a_tail_is_a_view_of_settled_memory_and_a_copy_of_any_other(settled: bool) -> None:
    """The unacknowledged end of the message, kept as the step ends: where the call says
    its send buffer stays as sent until the peers hold it (an all_gather's or broadcast's
    output, confirmed), a view of that buffer; else a copy. The same bytes either way."""
    links, ts = _pair()
    try:
        message, n = _tail_left_in_the_queue(links, ts, settled)
        _, _, parts = links[0].tails[1]
        tail = b"".join(parts)
        assert 0 < len(tail) < n and tail == message[n - len(tail) :].tobytes()
        lent = [np.shares_memory(np.frombuffer(p, np.uint8), message) for p in parts]
        assert any(lent) == settled
    finally:
        _close(ts)


@needs_ss
@pytest.mark.parametrize("settled", [False, True], ids=["copied", "settled"])
def test_a_tail_still_in_the_senders_queue_is_sent_again_from_the_byte_reached(
    settled: bool,
) -> None:
    """Rank 0's step ended with its message's tail unacknowledged; ``ss -K`` then destroys
    rank 0's socket and its queue. The tail rank 0 kept (a copy, or a view of a settled
    buffer) goes again from the byte rank 1 reached, and both ranks go on with the next
    call on the new link."""
    links, ts = _pair()
    try:
        message, n = _tail_left_in_the_queue(links, ts, settled)
        assert 1 in links[0].tails  # the tail was kept: the peer had not acknowledged it
        _reset(links[0].socks[1])
        got, back, sent_back = np.zeros(n, np.uint8), np.zeros(8, np.uint8), _payload(1, 8)
        mine = np.zeros(8, np.uint8)

        def rank1() -> None:
            _exchange(ts[1], 0, _call(2, n), 0, None, got)()
            _exchange(ts[1], 0, _call(3, 8), 0, sent_back, mine)()

        ranks = [Rank(_exchange(ts[0], 1, _call(3, 8), 0, _payload(0, 8), back)), Rank(rank1)]
        for r in ranks:
            r.start()
        for r in ranks:
            r.join(30)
            assert r.error is None and not r.is_alive(), r.error
        assert np.array_equal(got, message)
        assert np.array_equal(back, sent_back) and np.array_equal(mine, _payload(0, 8))
        assert links[0].resumed == [0, 1] and links[1].resumed == [1, 0]
    finally:
        _close(ts)


@needs_ss
def test_a_peer_that_linked_again_first_leaves_the_old_link_read_to_its_end() -> None:
    """As above, but rank 0 has linked again before rank 1's step begins: rank 1 reads
    what its old socket still holds of the message before it takes the new link, so the
    kept tail covers the rest."""
    links, ts = _pair()
    try:
        message, n = _tail_left_in_the_queue(links, ts)
        _reset(links[0].socks[1])
        back, got, mine = np.zeros(8, np.uint8), np.zeros(n, np.uint8), np.zeros(8, np.uint8)
        first = Rank(_exchange(ts[0], 1, _call(3, 8), 0, _payload(0, 8), back))
        first.start()
        _wait_until(lambda: links[1].has_fresh(0), "rank 0 link again")

        def rank1() -> None:
            _exchange(ts[1], 0, _call(2, n), 0, None, got)()
            _exchange(ts[1], 0, _call(3, 8), 0, _payload(1, 8), mine)()

        second = Rank(rank1)
        second.start()
        for r in (first, second):
            r.join(30)
            assert r.error is None and not r.is_alive(), r.error
        assert np.array_equal(got, message) and np.array_equal(back, _payload(1, 8))
        assert links[0].resumed == [0, 1] and links[1].resumed == [1, 0]
    finally:
        _close(ts)


@needs_ss
def test_a_message_its_sender_moved_past_is_lost_and_both_ranks_raise() -> None:
    """The same on links with MACs, which keep no tail (a message's tag covers all of it,
    so it goes again whole or not at all): nobody holds the tail, and both ranks say so."""
    links, ts = _pair(mac=True)
    try:
        _, n = _tail_left_in_the_queue(links, ts)
        _reset(links[0].socks[1])
        ranks = [
            Rank(_exchange(ts[0], 1, _call(3, 8), 0, None, np.zeros(8, np.uint8))),
            Rank(_exchange(ts[1], 0, _call(2, n), 0, None, np.zeros(n, np.uint8))),
        ]
        for r in ranks:
            r.start()
        for r in ranks:
            r.join(30)
        for r in ranks:
            assert isinstance(r.error, PeerError), [x.error for x in ranks]
            assert "message 1 from rank 0 to rank 1 was lost" in str(r.error), r.error
    finally:
        _close(ts)


def test_a_peer_that_closed_the_link_for_good_refuses_the_new_one(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """As the plan's ``link`` fault does: rank 1 drops the link, and its accept thread
    turns away rank 0's new one, so rank 0's step fails at once, saying why."""
    links, ts = _pair()
    try:
        _link(ts)
        links[1].drop(0)
        alone = Rank(_exchange(ts[0], 1, _call(2, 8), 0, None, np.zeros(8, np.uint8)))
        alone.start()
        alone.join(30)
        assert isinstance(alone.error, PeerError), alone.error
        assert "not resumed: the peer refused the new link" in str(alone.error)
        _wait_until(lambda: links[1].auth_failures == 1, "rank 1 count its refusal")
        assert "claiming rank 0: its link was closed earlier in this epoch" in caplog.text
        assert links[0].resumed == [0, 0]
    finally:
        _close(ts)


def test_a_peer_whose_links_are_gone_fails_the_step_without_waiting_for_it() -> None:
    _, ts = _pair(resume_s=600.0)  # a wait for it would outlast the test's timeout
    try:
        _link(ts)
        ts[1].close()  # its listener too: nothing takes a new connection
        alone = Rank(_exchange(ts[0], 1, _call(2, 8), 0, None, np.zeros(8, np.uint8)))
        alone.start()
        alone.join(30)
        assert isinstance(alone.error, PeerError), alone.error
        assert "not resumed" in str(alone.error) and "refused" in str(alone.error)
    finally:
        _close(ts)


def test_without_resume_a_reset_fails_the_step_as_before() -> None:
    links, ts = _pair(resume_s=0.0)
    try:
        data = [_payload(r, BIG) for r in range(2)]
        first = Rank(_exchange(ts[0], 1, _call(1, BIG), 0, data[0], np.zeros(BIG, np.uint8)))
        first.start()
        _wait_until(lambda: _mid_send(ts[0]), "rank 0 mid send")
        links[0].socks[1].shutdown(socket.SHUT_RDWR)
        first.join(30)
        assert isinstance(first.error, PeerError), first.error
        assert "not resumed" not in str(first.error)
    finally:
        _close(ts)


# -- the cursors -------------------------------------------------------------------------


def test_a_held_message_the_peer_lacks_is_sent_again() -> None:
    mine, theirs = Cursor(started=3, held=2, received=5), Cursor(started=5, held=-1, received=2)
    assert problem(mine, theirs, 0, 1) == ""
    assert resend(mine, theirs)


def test_a_held_message_the_peer_has_whole_is_not_sent_again() -> None:
    mine, theirs = Cursor(started=3, held=2, received=5), Cursor(started=6, held=5, received=3)
    assert problem(mine, theirs, 0, 1) == ""
    assert not resend(mine, theirs)
    assert resend(theirs, mine)  # the peer's held message 5 is what this side lacks


def test_a_kept_tail_covers_a_receiver_that_reached_it() -> None:
    sender = Cursor(started=3, held=-1, received=0, tail=2, tail_from=100)
    receiver = Cursor(started=0, held=-1, received=2, partial=150)
    assert problem(sender, receiver, 0, 1) == "" and from_tail(sender, receiver)
    assert not resend(sender, receiver)  # nothing held: the tail alone goes again


def test_a_kept_tail_is_followed_by_the_message_held_whole() -> None:
    sender = Cursor(started=4, held=3, received=0, tail=2, tail_from=100)
    receiver = Cursor(started=0, held=-1, received=2, partial=100)
    assert problem(sender, receiver, 0, 1) == ""
    assert from_tail(sender, receiver) and resend(sender, receiver)


@pytest.mark.parametrize(
    "receiver",
    [
        Cursor(0, -1, received=2, partial=99),  # short of the tail's first byte
        Cursor(0, -1, received=1, partial=500),  # an earlier message, not kept
    ],
)
def test_a_tail_that_does_not_reach_what_the_receiver_lacks_is_lost(receiver: Cursor) -> None:
    sender = Cursor(started=3, held=-1, received=0, tail=2, tail_from=100)
    assert "was lost" in problem(sender, receiver, 0, 1)


def test_bytes_in_hand_of_a_message_never_started_are_a_loss() -> None:
    assert lost(Cursor(started=2, held=-1, received=0), Cursor(0, -1, received=2, partial=8))


def test_a_message_not_yet_started_is_not_lost() -> None:
    assert not lost(Cursor(started=2, held=-1, received=0), Cursor(2, -1, 2))


@pytest.mark.parametrize(
    ("mine", "theirs", "why"),
    [
        (Cursor(3, -1, 0), Cursor(0, -1, 2), "message 2 from rank 0 to rank 1 was lost"),
        (Cursor(3, 2, 0), Cursor(0, -1, 1), "message 1 from rank 0 to rank 1 was lost"),
        (Cursor(0, -1, 0), Cursor(4, 3, 0), "message 0 from rank 1 to rank 0 was lost"),
        (Cursor(1, 0, 0), Cursor(0, -1, 2), "count of messages disagrees"),
    ],
)
def test_cursors_that_cannot_be_made_whole_say_why(mine: Cursor, theirs: Cursor, why: str) -> None:
    assert why in problem(mine, theirs, 0, 1)
    assert problem(theirs, mine, 1, 0)  # the other side comes to the same answer


@pytest.mark.parametrize(
    "frame",
    [
        Cursor(2, 2, 0).pack(),  # holds a message it never started
        Cursor(2, -2, 0).pack(),
        Cursor(2, -1, 0, tail=2).pack(),  # keeps the tail of a message it never started
        b"XXXX" + Cursor(2, 1, 0).pack()[4:],
    ],
)
def test_a_malformed_resume_frame_is_a_protocol_error(frame: bytes) -> None:
    with pytest.raises(ProtocolError, match="malformed resume frame"):
        Cursor.unpack(frame, 1)


def test_a_cursor_travels_whole() -> None:
    c = Cursor(started=12, held=11, received=9, partial=4096, tail=10, tail_from=77)
    assert Cursor.unpack(c.pack(), 1) == c


def _comms(ts: list[TcpTransport]) -> list[Communicator]:
    cfg = RuntimeConfig(job=JOB, timeout_s=30.0, connect_timeout_s=10.0)
    return [
        Communicator(rank=r, world_size=2, transport=t, cfg=cfg, comm_id=world_comm_id(2))
        for r, t in enumerate(ts)
    ]


def _both_ways_in_flight(links: Links) -> bool:
    """Rank 0's send to rank 1 is mid-message and its receive from rank 1 has begun, each
    in a step of its own (two threads)."""
    flow = links.flow(1)
    out, inc = flow.send, flow.recv
    return out is not None and out.item.begun and inc is not None and out.owner is not inc.owner


def _end_by(how: str, sock: socket.socket) -> None:
    if how == "ss -K":
        _reset(sock)
    else:
        sock.shutdown(socket.SHUT_RDWR)


@pytest.mark.parametrize("how", ["shutdown", pytest.param("ss -K", marks=needs_ss)])
@pytest.mark.parametrize("mac", [False, True], ids=["plain", "mac"])
def test_a_reset_while_a_send_and_a_receive_with_one_peer_are_in_flight_on_two_threads(
    how: str, mac: bool
) -> None:
    """The torch backend's lanes run a send and a receive with one peer at once, each in a
    step of its own: a reset of their link is resumed once, for both ways, whichever
    thread meets it first, and the other thread's transfer goes on over the new link. Rank
    0's send is mid-message (rank 1 reads nothing yet) and its receive waits on rank 1
    when the connection ends; rank 1's calls start after, on the link made again."""
    links, ts = _pair(mac=mac)
    comms = _comms(ts)
    data = [_payload(r, BIG) for r in range(2)]
    got = [np.zeros(BIG, np.uint8) for _ in range(2)]
    try:
        _link(ts)
        zero = [Rank(lambda: comms[0].send(data[0], 1)), Rank(lambda: comms[0].recv(got[0], 1))]
        for r in zero:
            r.start()
        _wait_until(lambda: _both_ways_in_flight(links[0]), "rank 0 both ways in flight")
        _end_by(how, links[0].socks[1])
        one = [Rank(lambda: comms[1].send(data[1], 0)), Rank(lambda: comms[1].recv(got[1], 0))]
        for r in one:
            r.start()
        for r in (*zero, *one):
            r.join(40)
        assert [(r.error, r.is_alive()) for r in (*zero, *one)] == [(None, False)] * 4
        assert np.array_equal(got[0], data[1]) and np.array_equal(got[1], data[0])
        assert links[0].resumed == [0, 1] and links[1].resumed == [1, 0]
    finally:
        _close(ts)
