"""The watchdog, fault plans and dump requests, each on its own (no processes)."""

from __future__ import annotations

import logging
import threading

import numpy as np
import pytest
from recording_tracer import RecordingTracer
from telemetry_helpers import wait_for
from thread_ranks import make_comms, run_comms, run_ranks

from cclctl.config import RuntimeConfig
from cclctl.errors import CollectiveTimeout, CommAborted, ConfigError, ProtocolError
from cclctl.records import STARTED, TIMED_OUT, CollectiveRecord
from cclctl.runtime.agent.dump_requests import DumpRequests, request_dump
from cclctl.runtime.comm import faults
from cclctl.telemetry.watchdog import Watchdog

S = 1_000_000_000


class FakeTelemetry:
    rank = 3

    def __init__(self, recs: list[CollectiveRecord]) -> None:
        self.recs = recs
        self.hangs: list[tuple[str, str]] = []
        self.dumps: list[str] = []
        self.published = 0

    def inflight(self) -> list[CollectiveRecord]:
        return [r for r in self.recs if r.state == STARTED]

    def count_hang(self, comm: str, op: str) -> None:
        self.hangs.append((comm, op))

    def dump(self, reason: str, path: str | None = None) -> str | None:
        self.dumps.append(reason)
        return "/tmp/d.json"

    def publish_now(self) -> bool:
        self.published += 1
        return True


def _rec(start_s: float, **kw: object) -> CollectiveRecord:
    fields: dict = {"comm": "0:0-7", "seq": 9, "op": "all_reduce", "nbytes": 64}
    fields.update(kw)
    return CollectiveRecord(start_ns=int(start_s * S), **fields)


def test_watchdog_warns_at_half_then_expires_once(caplog: pytest.LogCaptureFixture) -> None:
    rec = _rec(100, waiting_on=5, waiting_for="recv")
    tel = FakeTelemetry([rec])
    expired_lines: list[str] = []
    dog = Watchdog(tel, timeout_s=10, on_expire=lambda r, line: expired_lines.append(line))
    caplog.set_level(logging.WARNING, logger="cclctl.watchdog")

    assert dog.check(104 * S) == [] and not caplog.records
    assert dog.check(105 * S) == []
    assert dog.check(106 * S) == []  # warned once only
    assert [r.levelname for r in caplog.records] == ["WARNING"]
    assert dog.check(110 * S) == [rec]
    assert rec.state == TIMED_OUT and rec.error == "timed out after 10.0s"
    assert tel.hangs == [("0:0-7", "all_reduce")] and tel.dumps == ["hang"] and tel.published == 1
    assert expired_lines == [
        "rank 3: all_reduce seq 9 on comm 0:0-7 (64 bytes) has run 10.0s, "
        "waiting to recv from rank 5"
    ]
    assert "HANG" in caplog.records[-1].getMessage()
    assert dog.check(120 * S) == []  # a timed-out record is not expired twice


def test_abort_policy_calls_back_and_wait_policy_does_not() -> None:
    aborted: list[str] = []
    for policy, expect in (("abort", 1), ("wait", 0), ("raise", 0)):
        aborted.clear()
        dog = Watchdog(
            FakeTelemetry([_rec(0)]), 1, policy, on_abort=lambda r, why: aborted.append(why)
        )
        dog.check(2 * S)
        assert len(aborted) == expect, policy


def test_watchdog_thread_runs_and_stops() -> None:
    rec = _rec(0)
    tel = FakeTelemetry([rec])
    dog = Watchdog(tel, timeout_s=0.1, period_s=0.01, clock=lambda: 10 * S).start()
    try:
        for _ in range(200):
            if rec.state == TIMED_OUT:
                break
            import time

            time.sleep(0.01)
    finally:
        dog.stop()
    assert rec.state == TIMED_OUT


def test_a_blocked_call_raises_when_the_watchdog_expires_it() -> None:
    """Under the raise policy a real watchdog expires a call blocked on a peer that never
    comes; the communicator's failure state takes the hang and the call raises at once."""
    comms = make_comms(2, RuntimeConfig(job="w", timeout_s=0.5, on_hang="raise"), watchdog=True)
    tracer = RecordingTracer()
    dog = Watchdog(
        FakeTelemetry(tracer.started),
        timeout_s=5,
        policy="raise",
        on_expire=lambda rec, line: comms[0].failure.hung(rec, line, "raise"),
    )
    expired: list[CollectiveRecord] = []

    def expire_once_blocked() -> None:
        wait_for(lambda: tracer.started and tracer.started[0].waiting_on == 1)
        rec = tracer.started[0]
        expired.extend(dog.check(rec.start_ns + 5 * S))

    def body(comm):  # type: ignore[no-untyped-def]
        if comm.rank == 1:
            return None  # never enters: rank 0 blocks
        comm.tracer = tracer
        turn = threading.Thread(target=expire_once_blocked, daemon=True)
        turn.start()
        with pytest.raises(CollectiveTimeout, match="waiting to recv from rank 1"):
            comm.all_reduce(np.ones(4, np.float32))
        turn.join(5)
        with pytest.raises(CommAborted, match="the communicator was revoked"):
            comm.all_reduce(np.ones(4, np.float32))
        return comm.failure

    failure = run_comms(comms, body)[0]
    assert expired == tracer.started  # the watchdog expired the one call, which then ended
    assert tracer.started[0].state == TIMED_OUT and tracer.started[0].end_ns
    assert failure.first.kind == "hang" and failure.first.via == "watchdog"
    assert failure.first.origin == 1 and failure.first.seen_by == 0
    assert (failure.first.seq, failure.first.op, failure.later) == (1, "all_reduce", 1)


def test_abort_ends_a_blocked_call() -> None:
    def body(comm):  # type: ignore[no-untyped-def]
        if comm.rank == 1:
            return None
        import threading

        threading.Timer(0.2, comm.abort, args=("operator asked",)).start()
        with pytest.raises(CommAborted, match="seq 1 aborted by rank 0: operator asked"):
            comm.all_reduce(np.ones(4, np.float32))
        return True

    assert run_ranks(2, body)[0] is True


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("explode:rank=1:seq=2", "unknown fault 'explode'"),
        ("kill:rank=1", "missing seq="),
        ("kill:rank=x:seq=1", "rank and seq must be integers"),
        ("kill:rank=1:seq=0", "rank must be >= 0 and seq >= 1"),
        ("sleep:rank=1:seq=1", "sleep needs secs="),
        ("sleep:rank=1:seq=1:secs=-2", "secs='-2' must be a non-negative number"),
        ("op:rank=1:seq=1:to=gossip", "to='gossip' is not a collective"),
        ("dtype:rank=1:seq=1:to=complex64", "to='complex64' is not a dtype"),
        ("kill:rank=1:seq=1:color=red", "unexpected color"),
        ("kill:rank=1:seq=1:oops", "'oops' is not key=value"),
    ],
)
def test_bad_fault_plans_are_named(spec: str, message: str) -> None:
    with pytest.raises(ConfigError, match="CCLCTL_FAULT item") as info:
        faults.parse(spec)
    assert message in str(info.value)


def test_fault_plan_matches_rank_seq_and_comm() -> None:
    plan = faults.parse("kill:rank=1:seq=2 ; op:rank=0:seq=3:to=broadcast:comm=1:0-1")
    assert plan.at(1, 2, "0:0-3") == faults.Fault("kill", 1, 2)
    assert plan.at(1, 3, "0:0-3") is None
    assert plan.at(0, 3, "0:0-3") is None
    assert plan.at(0, 3, "1:0-1") == faults.Fault("op", 0, 3, "1:0-1", "broadcast")
    assert not faults.parse("")


@pytest.mark.parametrize(
    "fault",
    ["op:rank=1:seq=2:to=broadcast", "count:rank=1:seq=2:to=3", "dtype:rank=1:seq=2:to=float64"],
)
def test_injected_mismatch_is_caught_on_the_wire(fault: str) -> None:
    cfg = RuntimeConfig(job="f", timeout_s=5, fault=fault)

    def body(comm):  # type: ignore[no-untyped-def]
        x = np.ones(4, np.float32)
        comm.all_reduce(x)
        with pytest.raises(ProtocolError) as info:
            comm.all_reduce(x)
        return str(info.value)

    msgs = run_ranks(2, body, cfg)
    assert "seq 2" in msgs[0] and "rank 1 called" in msgs[0]


class DictStore:
    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}

    def set(self, key: str, value: bytes) -> None:
        self.data[key] = value

    def add(self, key: str, delta: int) -> int:
        value = int(self.data.get(key, b"0")) + delta
        self.data[key] = str(value).encode()
        return value

    def try_get(self, key: str) -> bytes | None:
        return self.data.get(key)


def test_dump_requests_reach_other_ranks_once() -> None:
    store = DictStore()
    reasons: list[str] = []

    class Dumper:
        def dump(self, reason: str, path: str | None = None) -> str | None:
            reasons.append(reason)
            return None

    other = DumpRequests(store, Dumper(), rank=2)
    me = DumpRequests(store, Dumper(), rank=0)
    other._seen = me._seen = 0
    assert not other.poll()
    request_dump(store, 0, "all_reduce seq 4 hung")
    assert not me.poll()  # the asking rank dumped already
    assert other.poll() and not other.poll()
    assert reasons == ["requested by rank 0: all_reduce seq 4 hung"]


def test_requests_before_a_rank_are_not_its_and_it_first_looks_on_its_thread() -> None:
    store = DictStore()
    request_dump(store, 0, "an earlier hang")
    reads: list[str] = []
    get = store.try_get
    store.try_get = lambda key: reads.append(key) or get(key)  # type: ignore[method-assign]

    class Dumper:
        def dump(self, reason: str, path: str | None = None) -> str | None:
            raise AssertionError(f"dumped for {reason}")

    requests = DumpRequests(store, Dumper(), rank=2, interval_s=3600).start()
    requests.stop()
    assert reads == []  # started without a read: its first look is on its thread
    assert not requests.poll()  # the first look: the earlier request is not its
    request_dump(store, 1, "all_reduce seq 9 hung")
    with pytest.raises(AssertionError, match="requested by rank 1: all_reduce seq 9 hung"):
        requests.poll()
