"""The periodic daemon thread behind the watchdog, the status publisher, the dump-request
poller and a torch session's folder."""

from __future__ import annotations

import logging
import threading
import time

import pytest

from cclctl.periodic import Periodic


def _wait_for(cond, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.001)


@pytest.mark.timeout(10)
def test_turns_come_every_period_with_a_first_and_a_last(caplog) -> None:
    turns: list[str] = []
    stopping = threading.Event()
    thread = Periodic(
        "t-basic",
        lambda: turns.append("after stop" if stopping.is_set() else "turn"),
        0.001,
        first=True,
        last=True,
    )
    thread.start()
    _wait_for(lambda: len(turns) >= 4)
    stopping.set()
    thread.stop()
    # stop() returns once the thread has ended: no turn can follow the last one
    assert not any(t.name == "t-basic" for t in threading.enumerate())
    assert turns[-1] == "after stop"  # the last turn came, after stop() was asked
    assert turns[:4] == ["turn"] * 4
    assert not caplog.records


@pytest.mark.timeout(10)
def test_a_failing_turn_is_logged_and_the_thread_goes_on(caplog) -> None:
    class Flaky(Exception):
        pass

    turns = []

    def turn() -> None:
        turns.append(1)
        if len(turns) == 1:
            raise RuntimeError("broken once")
        if len(turns) == 2:
            raise Flaky("expected now and then")

    thread = Periodic("t-flaky", turn, 0.001, quiet=(Flaky,)).start()
    try:
        _wait_for(lambda: len(turns) >= 3)
    finally:
        thread.stop()
    logged = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(logged) == 1 and "t-flaky failed" in logged[0].getMessage()
    assert "broken once" in (logged[0].exc_text or "")


class _RecordingEvent(threading.Event):
    """A stop event that keeps every timeout the thread waits on it with."""

    def __init__(self) -> None:
        super().__init__()
        self.waits: list[float | None] = []

    def wait(self, timeout: float | None = None) -> bool:
        self.waits.append(timeout)
        return super().wait(timeout)


@pytest.mark.timeout(10)
def test_a_turn_sets_the_next_wait_and_may_stop_its_own_thread() -> None:
    turns: list[int] = []
    holder: list[Periodic] = []

    def turn() -> float:
        turns.append(len(turns) + 1)
        if len(turns) == 3:
            holder[0].stop()  # from the thread itself: no join on itself
        return 0.0 if len(turns) < 2 else 0.05

    thread = Periodic("t-wait", turn, 60.0, first=True)  # its own period never comes here
    stop = thread._stop = _RecordingEvent()
    holder.append(thread)
    thread.start()
    _wait_for(lambda: not any(t.name == "t-wait" for t in threading.enumerate()))
    assert turns == [1, 2, 3]
    # each wait is the one the turn before asked for; the third ended as the turn stopped
    assert stop.waits == [0.0, 0.05, 0.05]
