"""The time a TCP message takes from its first byte to its last, as a step times it for
the slowness signals (``recv_transfer_ns``, under the peer's job rank): a message that
arrives in pieces is timed from the read that got its first bytes to the one that got its
last; one that arrives whole costs no clock read and adds nothing; nothing is timed with
the signals off. Real sockets (a socketpair), the step driven by hand."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from cclctl.runtime.failure import FailureState
from cclctl.runtime.transport import wire
from cclctl.runtime.transport.base import Wait
from cclctl.runtime.transport.tcp.flow import Flow
from cclctl.runtime.transport.tcp.step import TcpStep
from cclctl.telemetry.windows import PeerWaits

CALL = wire.Call(comm=0, epoch=0, seq=1, op="all_reduce", dtype="float32", redop="sum",
                 count=1 << 14)  # fmt: skip
NBYTES = 1 << 16


class _Links:
    """What a step reads of its links: one socket to peer 1, no MAC, no resume."""

    def __init__(self, sock: socket.socket) -> None:
        self.rank = 0
        self.socks = {1: sock}
        self.received = [0, 0]
        self.resume_s = 0.0
        self.stall_ms = 0
        self.tails: dict[int, object] = {}
        self.flows = {1: Flow()}

    def flow(self, peer: int) -> Flow:
        return self.flows[peer]

    def session(self, peer: int) -> None:
        return None

    def has_fresh(self, peer: int | None = None) -> bool:
        return False


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    mine, theirs = socket.socketpair()
    mine.setblocking(False)
    try:
        yield mine, theirs
    finally:
        mine.close()
        theirs.close()


def _step(mine: socket.socket, waits: PeerWaits | None, members: tuple[int, ...] = ()) -> TcpStep:
    wait = Wait(0, None, failure=FailureState(0, "0:0-1", None, members), waits=waits)
    links = _Links(mine)
    return TcpStep(links, CALL, 0, wait, {}, {1: memoryview(bytearray(NBYTES))})  # type: ignore[arg-type]


def _message() -> bytes:
    return wire.pack(CALL, 0, NBYTES) + bytes(range(256)) * (NBYTES // 256)


def test_a_message_that_arrives_in_pieces_is_timed_under_the_peers_job_rank(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    mine, theirs = pair
    waits = PeerWaits()
    step = _step(mine, waits, members=(4, 7))  # a shrunk communicator: its rank 1 is job rank 7
    message = _message()
    theirs.sendall(message[:1000])
    assert step.advance() and not step.done  # the first bytes: timing starts
    theirs.sendall(message[1000:])
    while not step.done:
        step.advance()
    assert waits.transfers()[7] > 0
    assert waits.copy()[7] == (0, 0, 0, 0)  # no wait: a transfer time is not a block


def test_a_message_that_arrives_whole_adds_nothing(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    mine, theirs = pair
    waits = PeerWaits()
    step = _step(mine, waits)
    theirs.sendall(_message())
    while not step.done:
        step.advance()
    assert waits.transfers().get(1, 0) == 0


def test_nothing_is_timed_with_the_signals_off(pair: tuple[socket.socket, socket.socket]) -> None:
    mine, theirs = pair
    step = _step(mine, None)
    message = _message()
    theirs.sendall(message[:1000])
    step.advance()
    assert [item.began for item in step.pending] == [0]  # type: ignore[union-attr]
    theirs.sendall(message[1000:])
    while not step.done:
        step.advance()
