"""The time a step blocks on a peer, as the drive loop hands it to telemetry's PeerWaits:
entry wait until the peer shows progress in the call, then send or receive wait (the data
phase), under the peer's job rank; nothing measured when the signals are off."""

from __future__ import annotations

from cclctl.runtime.failure import FailureState
from cclctl.runtime.transport import drive as driving
from cclctl.runtime.transport.base import Wait
from cclctl.runtime.transport.drive import drive, exchanged
from cclctl.telemetry.windows import PeerWaits


class Share:
    """Transfers to one peer that move one at a time, each after one block on it."""

    def __init__(self, peer: int, what: str, moves: int) -> None:
        self.peer, self.what = peer, what
        self.left = moves
        self.ready = False
        self.blocks = 0

    @property
    def done(self) -> bool:
        return self.left == 0

    def advance(self) -> bool:
        if not self.ready:
            return False
        self.ready = False
        self.left -= 1
        return True

    def waiting_on(self) -> tuple[int, str]:
        return self.peer, self.what

    def check(self) -> None:
        pass

    def block(self, wait: Wait, peer: int, what: str, slice_s: float | None) -> None:
        self.blocks += 1
        self.ready = True


def _wait(members: tuple[int, ...] = ()) -> Wait:
    failure = FailureState(0, "0:0-3", None, members)
    return Wait(0, None, failure=failure, waits=PeerWaits(), exchanged=[])


def _kinds(wait: Wait) -> dict[int, tuple[bool, bool, bool]]:
    """Per job rank: (any send wait, any receive wait, any entry wait)."""
    return {p: (s > 0, r > 0, es + er > 0) for p, (s, r, es, er) in wait.waits.copy().items()}


def test_the_first_wait_on_a_peer_is_its_entry_and_later_ones_the_data_phase() -> None:
    wait = _wait()
    drive([Share(2, "recv", moves=3)], wait)
    assert _kinds(wait) == {2: (False, True, True)}  # one entry wait, then two data waits
    send = _wait()
    drive([Share(1, "send", moves=1)], send)
    assert _kinds(send) == {1: (False, False, True)}


def test_a_peer_received_from_in_a_completed_step_has_arrived() -> None:
    wait = _wait()
    exchanged(wait, [(3, memoryview(b"x"))])  # step 0 took rank 3's message unblocked
    drive([Share(3, "recv", moves=1)], wait)
    assert _kinds(wait) == {3: (False, True, False)}


def test_waits_are_filed_under_the_job_rank() -> None:
    wait = _wait(members=(0, 5, 9))  # a shrunk communicator: its rank 2 is job rank 9
    drive([Share(2, "send", moves=2)], wait)
    assert _kinds(wait) == {9: (True, False, True)}


def test_several_shares_mark_the_peer_of_the_share_that_blocked() -> None:
    wait = _wait()
    near, far = Share(1, "recv", moves=1), Share(4, "recv", moves=2)
    near.ready = True  # moves at once: never blocked on
    drive([near, far], wait)
    assert _kinds(wait) == {4: (False, True, True)}
    assert wait.arrived == {4}


def test_nothing_is_measured_with_the_signals_off() -> None:
    wait = Wait(0, None)
    share = Share(2, "recv", moves=2)
    drive([share], wait)
    exchanged(wait, [(2, memoryview(b"x"))])
    assert share.blocks == 2 and wait.arrived is None and wait.exchanged is None


def test_account_folds_completed_steps_once() -> None:
    wait = _wait()
    exchanged(wait, [(1, memoryview(b"a")), (2, memoryview(b"b"))])
    driving.account(wait, 2, "recv", 5)
    driving.account(wait, 3, "send", 7)
    assert wait.exchanged == [] and wait.arrived == {1, 2}
    assert wait.waits.copy() == {2: (0, 5, 0, 0), 3: (0, 0, 7, 0)}
