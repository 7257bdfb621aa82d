"""A communicator's one failure state: first failure wins, every call checks it."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from recording_tracer import RecordingTracer
from telemetry_helpers import wait_for
from thread_ranks import make_comms, run_comms, run_ranks

from cclctl.errors import CollectiveTimeout, CommAborted, CommError, PeerError
from cclctl.records import ABORTED, CollectiveRecord
from cclctl.runtime.failure import ABORTED as STATE_ABORTED
from cclctl.runtime.failure import BROKEN, CLOSED, OK, FailureState, Origin

LINK = Origin("peer", "link to rank 3 broke", 3, 7, "all_reduce")


def test_the_first_failure_wins_and_later_ones_are_counted() -> None:
    told: list[str] = []
    state = FailureState(0, "0:0-3", told.append)
    assert state.status is OK and state.first is None
    assert state.fail(LINK)
    assert not state.abort("operator asked")
    assert not state.fail(Origin("timeout", "too slow", 0, 8, "broadcast"))
    assert (state.status, state.first, state.later) == (BROKEN, LINK, 2)
    assert told == ["broken"]  # a link failure reaches local peers; the others do not


def test_only_link_failures_and_close_are_announced() -> None:
    told: list[str] = []
    state = FailureState(0, "c", told.append)
    state.abort("drain")
    assert state.status is STATE_ABORTED and told == []
    state.fail(Origin("mismatch", "peer 1 called broadcast", 1, 2, "all_reduce"))
    assert told == ["broken"] and state.later == 1
    assert state.close() and not state.close()
    assert state.status is CLOSED and told == ["broken", "closed"]
    assert state.first is not None and state.first.reason == "drain"  # close is no failure


def test_every_call_is_refused_after_a_failure_naming_the_first() -> None:
    tracer = RecordingTracer()

    def body(comm):  # type: ignore[no-untyped-def]
        comm.tracer = tracer
        comm.failure.fail(LINK)
        comm.failure.abort("later")
        x = np.ones(4, np.float32)
        calls = [
            lambda: comm.all_reduce(x),
            lambda: comm.broadcast(x),
            lambda: comm.reduce(x),
            lambda: comm.all_gather(x, np.empty(4, np.float32)),
            lambda: comm.barrier(),
        ]
        messages = []
        for call in calls:
            with pytest.raises(CommAborted) as info:
                call()
            messages.append(str(info.value))
        return messages

    messages = run_ranks(1, body)[0]
    assert all(
        "unusable after an earlier failure (all_reduce seq 7: link to rank 3" in m for m in messages
    )
    assert tracer.started == []  # refused as they opened: no seq given, nothing recorded


def test_an_abort_refuses_a_call_on_a_world_of_one() -> None:
    """A world of one never blocks, so only the check as a call opens can stop it."""

    def body(comm):  # type: ignore[no-untyped-def]
        x = np.ones(4, np.float32)
        comm.all_reduce(x)
        comm.abort("drain the job")
        with pytest.raises(CommAborted, match=r"aborted \(drain the job\)"):
            comm.all_reduce(x)
        with pytest.raises(CommAborted, match=r"aborted \(drain the job\)"):
            comm.barrier()
        return comm.failure.first

    first = run_ranks(1, body)[0]
    assert (first.kind, first.seen_by, first.seq) == ("aborted", "abort", None)


def test_an_abort_reaches_a_blocked_wait_and_the_call_that_opens_next() -> None:
    comms = make_comms(2)
    tracer = RecordingTracer()

    def abort_once_blocked() -> None:
        wait_for(lambda: tracer.started and tracer.started[0].waiting_on == 1)
        comms[0].abort("operator asked")

    def body(comm):  # type: ignore[no-untyped-def]
        if comm.rank == 1:
            return None  # never enters: rank 0 blocks
        comm.tracer = tracer
        aborter = threading.Thread(target=abort_once_blocked, daemon=True)
        aborter.start()
        with pytest.raises(CommAborted, match=r"all_reduce seq 1 aborted \(operator asked\)"):
            comm.all_reduce(np.ones(4, np.float32))
        aborter.join(5)
        with pytest.raises(CommAborted, match=r"aborted \(operator asked\)"):
            comm.broadcast(np.ones(4, np.float32))
        return comm.failure.status, comm.failure.later

    status, later = run_comms(comms, body)[0]
    assert [r.state for r in tracer.started] == [ABORTED]  # the second call never opened
    assert status is STATE_ABORTED and later == 1  # the blocked call's own error, counted


def test_a_closed_communicator_refuses_calls() -> None:
    comm = make_comms(1)[0]
    comm.close()
    comm.close()  # idempotent
    with pytest.raises(CommError, match="all_reduce on a closed communicator"):
        comm.all_reduce(np.ones(4, np.float32))
    assert comm.failure.status is CLOSED and comm.failure.first is None


def _rec(**kw: object) -> CollectiveRecord:
    fields: dict = {"comm": "0:0-1", "seq": 4, "op": "all_reduce", "start_ns": 1}
    fields.update(kw)
    return CollectiveRecord(**fields)


def test_the_watchdog_policy_decides_what_a_hang_does() -> None:
    state = FailureState(0, "0:0-1")
    assert not state.hung(_rec(), "stuck", "wait") and state.status is OK
    assert not state.hung(_rec(end_ns=2), "stuck", "raise")  # it ended meanwhile
    assert not state.hung(_rec(comm="1:0-1"), "stuck", "raise")  # another communicator's
    assert state.hung(_rec(), "stuck", "abort")
    assert state.status is STATE_ABORTED and state.first == Origin(
        "aborted", "watchdog: stuck", 0, 4, "all_reduce", "watchdog"
    )
    raised = FailureState(0, "0:0-1")
    assert raised.hung(_rec(), "stuck", "raise") and raised.status is BROKEN
    with pytest.raises(CollectiveTimeout, match=r"all_reduce seq 4 timed out after 2\.0s"):
        raised.stop("all_reduce", 4, 1, "recv", 2.0)


def test_a_call_that_fails_records_its_origin() -> None:
    state = FailureState(0, "0:0-1")
    rec = _rec(error="shared-memory link to rank 1 broke")
    exc = PeerError("link broke", rank=0, peer=1, seq=4, op="all_reduce")
    assert state.call_failed(exc, rec)
    assert state.first == Origin("peer", "shared-memory link to rank 1 broke", 1, 4, "all_reduce")


def test_a_new_epoch_clears_the_failure_and_calls_carry_it() -> None:
    tracer = RecordingTracer()

    def body(comm):  # type: ignore[no-untyped-def]
        comm.tracer = tracer
        comm.abort("recovering")
        assert comm.failure.bump_epoch() == 1
        comm.all_reduce(np.ones(4, np.float32))
        comm.close()
        with pytest.raises(CommError, match="closed"):
            comm.failure.bump_epoch()
        return comm.failure.epoch

    assert run_ranks(1, body)[0] == 1
    assert [(r.epoch, r.state) for r in tracer.started] == [(1, "completed")]
