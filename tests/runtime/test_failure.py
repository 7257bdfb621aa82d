"""A communicator's one failure state: first failure wins, every call checks it."""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest
from recording_tracer import RecordingTracer
from telemetry_helpers import wait_for
from thread_ranks import make_comms, run_comms, run_ranks

from cclctl.errors import (
    CollectiveAborted,
    CollectiveTimeout,
    CommAborted,
    CommError,
    CommRevoked,
    PeerError,
    ProtocolError,
)
from cclctl.records import ABORTED, CollectiveRecord
from cclctl.revocation import Revocation
from cclctl.runtime.failure import ABORTED as STATE_ABORTED
from cclctl.runtime.failure import BROKEN, CLOSED, OK, PEER, FailureState
from cclctl.runtime.transport.base import Wait
from cclctl.runtime.transport.wire import Call

LINK = Revocation("link", 3, "connection reset", seq=7, op="all_reduce", seen_by=0, peer=0)


def _told() -> tuple[list[tuple[str, Revocation | None]], FailureState]:
    told: list[tuple[str, Revocation | None]] = []
    return told, FailureState(0, "0:0-3", lambda status, rev: told.append((status, rev)))


def test_the_first_failure_wins_and_later_ones_are_counted() -> None:
    told, state = _told()
    assert state.status is OK and state.first is None
    assert state.fail(LINK)
    assert not state.abort("operator asked")
    assert not state.fail(Revocation("hang", 0, "too slow", seq=8, op="broadcast"))
    assert (state.status, state.first, state.later) == (BROKEN, LINK, 2)
    assert told == [("broken", LINK)]  # the first failure, with its record, spreads once


def test_every_first_failure_and_the_close_are_announced() -> None:
    told, state = _told()
    state.abort("drain")
    assert state.status is STATE_ABORTED and told == [("broken", state.first)]
    state.fail(Revocation("mismatch", 1, "called broadcast", seq=2))
    assert state.later == 1 and len(told) == 1
    assert state.close() and not state.close()
    assert state.status is CLOSED and told[-1] == ("closed", None)
    assert state.first is not None and state.first.reason == "drain"  # close is no failure


def test_listeners_hear_the_first_failure_and_how_it_came() -> None:
    heard: list[tuple[str, str]] = []
    state = FailureState(2, "0:0-3")
    state.on_first(lambda rev, how: heard.append((rev.kind, how)))
    rev = Revocation("died", 6, "SIGKILL", seen_by=3)
    assert state.adopt(rev) and not state.adopt(rev)
    assert heard == [("died", PEER)] and state.status is BROKEN
    assert FailureState(0).adopt(Revocation("aborted", -1, "drain", via="operator"))


def test_a_record_names_its_origin_process() -> None:
    state = FailureState(1, "0:0-2")
    state.peers = [("vm", 100), ("vm", 101), ("other", 102)]
    rev = state.record("died", "SIGKILL", 2, seq=5, op="all_reduce")
    assert (rev.host, rev.pid, rev.seen_by, rev.comm) == ("other", 102, 1, "0:0-2")
    assert rev.describe() == "rank 2 (pid 102 on other) died (SIGKILL, seen by rank 1)"


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
        "revoked in all_reduce seq 7: link between rank 3 and rank 0 broke" in m for m in messages
    )
    assert tracer.started == []  # refused as they opened: no seq given, nothing recorded


def test_an_abort_refuses_a_call_on_a_world_of_one() -> None:
    """A world of one never blocks, so only the check as a call opens can stop it."""

    def body(comm):  # type: ignore[no-untyped-def]
        x = np.ones(4, np.float32)
        comm.all_reduce(x)
        comm.abort("drain the job")
        with pytest.raises(CollectiveAborted, match="aborted by rank 0: drain the job"):
            comm.all_reduce(x)
        with pytest.raises(CollectiveAborted, match="aborted by rank 0: drain the job"):
            comm.barrier()
        return comm.failure.first

    first = run_ranks(1, body)[0]
    assert (first.kind, first.seen_by, first.via, first.seq) == ("aborted", 0, "abort", None)


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
        with pytest.raises(
            CollectiveAborted, match=r"count 4\) seq 1 aborted by rank 0: operator asked"
        ):
            comm.all_reduce(np.ones(4, np.float32))
        aborter.join(5)
        with pytest.raises(CollectiveAborted, match="aborted by rank 0: operator asked"):
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
    assert state.status is STATE_ABORTED and state.first is not None
    assert (state.first.kind, state.first.reason, state.first.via, state.first.seq) == (
        "aborted", "watchdog: stuck", "watchdog", 4,
    )  # fmt: skip
    raised = FailureState(0, "0:0-1")
    origin = Revocation("hang", 1, "is stopped", seen_by=0, via="watchdog", seq=4)
    assert raised.hung(_rec(waiting_on=1), "stuck", "raise", origin) and raised.status is BROKEN
    stopped = r"seq 4 timed out after 2\.0s waiting to recv from rank 1: rank 1 is stopped"
    with pytest.raises(CollectiveTimeout, match=stopped):
        raised.stop("all_reduce(x)", "all_reduce", 4, 1, "recv", 2.0)


def test_a_call_that_fails_records_what_it_saw_and_raises_naming_it() -> None:
    state = FailureState(0, "0:0-1")
    state.host, state.peers = "vm", [("vm", os.getpid()), ("vm", os.getpid())]
    exc = PeerError("link broke", rank=0, peer=1, seq=4, op="all_reduce", why="reset")
    first = state.call_failed(exc, _rec(), "all_reduce(float32, sum, count 8)")
    assert first is not None and (first.kind, first.origin, first.peer, first.reason) == (
        "link", 0, 1, "reset",
    )  # fmt: skip  # rank 1 lives (its pid is ours): a link fault, not a death
    assert isinstance(state.error(first, "rank 0: x seq 4"), PeerError)  # its own: as it was


def test_a_peer_whose_process_is_gone_died() -> None:
    state = FailureState(0, "0:0-1")
    state.host, state.peers = "vm", [("vm", os.getpid()), ("vm", 2**22 + 12345)]
    exc = PeerError("link broke", rank=0, peer=1, seq=4, op="all_reduce", why="reset")
    first = state.call_failed(exc, _rec(), "all_reduce(float32, sum, count 8)")
    assert first is not None and (first.kind, first.origin, first.reason) == (
        "died", 1, "process exited",
    )  # fmt: skip


def test_a_mismatch_names_the_peer_and_both_calls() -> None:
    state = FailureState(0, "0:0-1")
    exc = ProtocolError("mismatch", peer=1, mine="all_reduce(count 8)", theirs="broadcast(count 8)")
    first = state.call_failed(exc, _rec(), "all_reduce(count 8)")
    assert first is not None and first.kind == "mismatch" and first.origin == 1
    assert first.reason == "called broadcast(count 8) where rank 0 called all_reduce(count 8)"


def _shrunk() -> FailureState:
    """Job rank 5, the shrunk communicator 1:0,2-5's rank 3 (rank 1 was shrunk away), with
    the job's table of processes."""
    state = FailureState(5, "1:0,2-5", members=[0, 2, 3, 5, 6])
    state.host = "vm"
    state.peers = [("vm", os.getpid())] * 7
    return state


def test_a_shrunk_communicators_failures_name_the_jobs_ranks() -> None:
    """Its transport numbers the members 0-4; records name the job's ranks."""
    state = _shrunk()
    exc = PeerError("link broke", rank=3, peer=2, seq=4, op="all_reduce", why="reset")
    first = state.call_failed(exc, _rec(), "all_reduce(float32, sum, count 8)")
    assert first is not None and (first.kind, first.origin, first.peer, first.seen_by) == (
        "link", 3, 5, 5,
    )  # fmt: skip  # the communicator's 2 is the job's 3
    mismatch = _shrunk().witnessed(
        ProtocolError("mismatch", peer=4, mine="all_reduce(count 8)", theirs="broadcast(count 8)"),
        _rec(), "all_reduce(count 8)",
    )  # fmt: skip
    assert (mismatch.origin, mismatch.peer) == (6, 5)
    assert mismatch.reason == "called broadcast(count 8) where rank 5 called all_reduce(count 8)"


def test_a_shrunk_communicators_waits_and_timeouts_name_the_jobs_ranks() -> None:
    state = _shrunk()
    rec = _rec()
    wait = Wait(state.rank, rec, deadline=0.0, failure=state)
    wait.blocked_on(1, "recv")  # the communicator's rank 1: the job's 2
    assert (rec.waiting_on, rec.waiting_for) == (2, "recv")
    with pytest.raises(CollectiveTimeout, match=r"rank 5: all_reduce seq 4 .*from rank 2") as got:
        wait.check(Call(0, 0, 4, "all_reduce"), 1, "recv")
    hang = state.witnessed(got.value, rec, "all_reduce")
    assert (hang.kind, hang.origin, hang.seen_by) == ("hang", 2, 5)


def test_a_failure_from_elsewhere_is_raised_as_revoked_naming_its_origin() -> None:
    state = FailureState(4, "0:0-7")
    state.adopt(Revocation("died", 6, "SIGKILL", host="vm", pid=36, seen_by=3))
    exc = state.error(state.first, "rank 4: all_reduce(float32, sum, count 8) seq 11")  # type: ignore[arg-type]
    assert isinstance(exc, CommRevoked) and exc.fields["origin"] == 6
    assert str(exc) == (
        "rank 4: all_reduce(float32, sum, count 8) seq 11 revoked: "
        "rank 6 (pid 36 on vm) died (SIGKILL, seen by rank 3)"
    )


def test_an_operators_abort_raises_collective_aborted_naming_the_operator() -> None:
    state = FailureState(1, "0:0-3")
    state.adopt(Revocation("aborted", -1, "maintenance", by="root@vm", via="operator"))
    with pytest.raises(CollectiveAborted, match="seq 3 aborted by operator root@vm: maintenance"):
        state.stop("all_reduce(x)", "all_reduce", 3, 2, "recv", 0.1)
    with pytest.raises(CommAborted, match="refused: aborted by operator root@vm: maintenance"):
        state.refuse("broadcast")


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
