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
    thread = Periodic("t-basic", lambda: turns.append("turn"), 0.001, first=True, last=True)
    thread.start()
    _wait_for(lambda: len(turns) >= 4)
    thread.stop()
    count = len(turns)
    time.sleep(0.02)
    assert len(turns) == count  # stopped: the last turn was the final one
    assert not any(t.name == "t-basic" for t in threading.enumerate())
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


@pytest.mark.timeout(10)
def test_a_turn_sets_the_next_wait_and_may_stop_its_own_thread() -> None:
    turns: list[float] = []
    holder: list[Periodic] = []

    def turn() -> float:
        turns.append(time.monotonic())
        if len(turns) == 3:
            holder[0].stop()  # from the thread itself: no join on itself
        return 0.0 if len(turns) < 2 else 0.05

    thread = Periodic("t-wait", turn, 60.0, first=True)  # its own period never comes here
    holder.append(thread)
    thread.start()
    _wait_for(lambda: not any(t.name == "t-wait" for t in threading.enumerate()))
    assert len(turns) == 3
    assert turns[2] - turns[1] >= 0.045  # the wait the second turn asked for
