"""The one drive loop, against fake shares that behave like TCP's (a bounded poll that may
return with nothing to move) and like shared memory's (a sleep that ends when a transfer
can move, and a check that sees a failed peer)."""

from __future__ import annotations

import math
import time

import pytest

from cclctl.errors import CollectiveTimeout, PeerError
from cclctl.records import CollectiveRecord
from cclctl.runtime.transport.base import Wait
from cclctl.runtime.transport.drive import MIXED_SLICE_S, drive
from cclctl.runtime.transport.wire import Call

CALL = Call(comm=1, epoch=0, seq=7, op="all_reduce", dtype="float32", count=4)


class FakeShare:
    """Transfers (peer, "send"|"recv") that complete once they are released.

    ``released`` transfers complete at the next ``advance``; what ``block`` releases is
    the subclass's business. Every call is logged as (name, method, ...)."""

    def __init__(self, name: str, transfers: list[tuple[int, str]], log: list[tuple]) -> None:
        self.name = name
        self.pending = list(transfers)
        self.released = 0
        self.log = log

    @property
    def done(self) -> bool:
        return not self.pending

    def advance(self) -> bool:
        self.log.append((self.name, "advance"))
        n = min(self.released, len(self.pending))
        del self.pending[:n]
        self.released -= n
        return n > 0

    def waiting_on(self) -> tuple[int, str]:
        first = next((t for t in self.pending if t[1] == "recv"), self.pending[0])
        return first

    def check(self) -> None:
        self.log.append((self.name, "check"))


class SocketLike(FakeShare):
    """Like TCP: each block is one bounded poll; the peer's bytes arrive after ``polls``."""

    def __init__(self, name: str, transfers: list[tuple[int, str]], log: list, polls: int):
        super().__init__(name, transfers, log)
        self.polls = polls

    def block(self, wait: Wait, peer: int, what: str, slice_s: float | None) -> None:
        self.log.append((self.name, "block", peer, what, slice_s))
        wait.check(CALL, peer, what)
        self.polls -= 1
        if self.polls <= 0:
            self.released = len(self.pending)


class MemoryLike(FakeShare):
    """Like shared memory: a block returns once a transfer can move (one at a time) and a
    peer marked ``failed`` makes ``check`` and ``block`` raise."""

    failed = False

    def check(self) -> None:
        super().check()
        if self.failed:
            raise PeerError("shared-memory link to rank 3 broke: rank 3 failed", peer=3)

    def block(self, wait: Wait, peer: int, what: str, slice_s: float | None) -> None:
        self.log.append((self.name, "block", peer, what, slice_s))
        wait.check(CALL, peer, what)
        self.check()
        self.released = 1


def _wait(deadline: float = math.inf) -> Wait:
    return Wait(rank=0, record=CollectiveRecord("c", 7, "all_reduce"), deadline=deadline)


def test_a_share_alone_blocks_its_own_way_and_reports_the_receive_first() -> None:
    log: list[tuple] = []
    share = SocketLike("tcp", [(1, "send"), (2, "recv")], log, polls=2)
    wait = _wait()
    drive([share], wait)
    assert share.done
    blocks = [e for e in log if e[1] == "block"]
    assert blocks == [("tcp", "block", 2, "recv", None)] * 2  # its own bound, twice
    assert wait.record is not None
    assert (wait.record.waiting_on, wait.record.waiting_for) == (2, "recv")


def test_a_share_that_moves_at_once_never_blocks() -> None:
    log: list[tuple] = []
    share = MemoryLike("shm", [(1, "send"), (1, "recv")], log)
    share.released = 2
    drive([share], _wait())
    assert log == [("shm", "advance")]


def test_shares_with_nothing_to_move_are_not_advanced() -> None:
    log: list[tuple] = []
    drive([MemoryLike("shm", [], log), SocketLike("tcp", [], log, polls=1)], _wait())
    assert log == []


def test_several_stuck_shares_check_the_others_and_poll_the_last_briefly() -> None:
    log: list[tuple] = []
    near = MemoryLike("shm", [(1, "recv")], log)
    far = SocketLike("tcp", [(2, "send"), (3, "recv")], log, polls=3)
    wait = _wait()
    drive([near, far], wait)
    assert near.done and far.done
    tcp_blocks = [i for i, e in enumerate(log) if e[:2] == ("tcp", "block")]
    assert [log[i] for i in tcp_blocks] == [("tcp", "block", 3, "recv", MIXED_SLICE_S)] * 3
    beside = log[: tcp_blocks[-1]]
    assert beside.count(("shm", "check")) == 3
    assert not any(e[:2] == ("shm", "block") for e in beside)  # never sleeps beside sockets
    # Once the sockets are done, shared memory waits alone, its own way.
    assert [e for e in log[tcp_blocks[-1] + 1 :] if e[1] == "block"] == [
        ("shm", "block", 1, "recv", None)
    ]
    # Every turn advances every live share before anything blocks.
    first_block = next(i for i, e in enumerate(log) if e[1] == "block")
    assert {e[0] for e in log[:first_block] if e[1] == "advance"} == {"shm", "tcp"}


def test_once_one_share_is_done_the_other_blocks_alone() -> None:
    log: list[tuple] = []
    near = MemoryLike("shm", [(1, "recv"), (1, "recv")], log)
    near.released = 2
    far = SocketLike("tcp", [(2, "recv")], log, polls=1)
    drive([near, far], _wait())
    assert [e for e in log if e[1] in ("block", "check")] == [("tcp", "block", 2, "recv", None)]


def test_a_failed_peer_on_the_checked_share_ends_the_step() -> None:
    log: list[tuple] = []
    near = MemoryLike("shm", [(1, "recv")], log)
    near.failed = True
    far = SocketLike("tcp", [(2, "recv")], log, polls=10**6)
    with pytest.raises(PeerError, match="rank 3 failed"):
        drive([near, far], _wait())


def test_the_deadline_names_what_the_stuck_share_waits_on() -> None:
    log: list[tuple] = []
    share = MemoryLike("shm", [(4, "recv")], log)
    with pytest.raises(CollectiveTimeout, match="waiting to recv from rank 4") as info:
        drive([share], _wait(deadline=time.monotonic() - 1))
    assert info.value.fields["waiting_for"] == "recv" and info.value.fields["peer"] == 4
