"""A rank process's one revoke end, on its own (a fake key, a fake clock; no store).

Its followers (the runtime's communicators, the torch wrapper) each get every record the
job writes, one that follows late included; the documents carry the first record a
follower carries; and a hang's origin is asked of the live diagnosis again for a status
interval or two while it names nobody (under load the statuses may not show the hang yet
when the watchdog expires a call)."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable

from diagnose_factory import Job

from cclctl.config import RuntimeConfig
from cclctl.live.snapshot import JobStatuses
from cclctl.records import CollectiveRecord
from cclctl.revocation import Revocation
from cclctl.runtime.failure import FailureState
from cclctl.runtime.job.revoke_end import JobRevokeEnd, Suspect, first_named
from cclctl.runtime.job.revoker import Revoker

WAIT_S = 10.0  # a bound on an event the test waits for, never a pace


class FakeKey:
    """The store's side of a revoke end: records to hand on, statuses to read, agreements."""

    def __init__(self, statuses: list[JobStatuses] | None = None) -> None:
        self.records: queue.Queue[Revocation | None] = queue.Queue()
        self.statuses_seq = list(statuses or [])
        self.fetched = 0
        self.record: Revocation | None = None
        self.scoped = None  # what the runtime's Revoker decides a mismatch with
        self.claims: dict[str, bytes] = {}  # a hang's claim (this rank is the only one)

    def next_record(self, stopped: threading.Event) -> Revocation | None:
        return None if stopped.is_set() else self.records.get()

    def stop_listening(self) -> None:
        self.records.put(None)

    def close(self) -> None:
        pass

    def stored(self) -> Revocation | None:
        return self.record

    def agree(self, record: Revocation) -> Revocation:
        self.record = self.record or record
        return self.record

    def compare_set(self, key: str, expected: bytes | None, desired: bytes) -> bytes:
        now = self.claims.setdefault(key, desired) if expected is None else self.claims[key]
        return now

    def set(self, key: str, value: bytes) -> None:
        self.claims[key] = value

    def try_get(self, key: str) -> bytes | None:
        return self.claims.get(key)

    def statuses(self) -> JobStatuses:
        self.fetched += 1
        return self.statuses_seq[min(self.fetched, len(self.statuses_seq)) - 1]


class FakeDocuments:
    rank = 0

    def __init__(self) -> None:
        self.cfg = RuntimeConfig(timeout_s=10.0, status_interval_s=1.0)
        self.revoke_source: Callable[[], Revocation | None] | None = None


class FakeClock:
    """Time that moves only when the end waits."""

    def __init__(self) -> None:
        self.now = 0.0
        self.waits: list[float] = []

    def __call__(self) -> float:
        return self.now

    def wait(self, seconds: float) -> bool:
        self.waits.append(seconds)
        self.now += seconds
        return False


def _end(key: FakeKey, clock: FakeClock | None = None) -> tuple[JobRevokeEnd, FakeDocuments]:
    docs = FakeDocuments()
    clock = clock or FakeClock()
    return JobRevokeEnd(key, docs, clock=clock, wait=clock.wait), docs  # type: ignore[arg-type]


def _statuses(in_call_s: float) -> JobStatuses:
    """Ranks 0, 1 and 3 in all_reduce seq 11 for ``in_call_s``; rank 2 never entered it."""
    job = Job(4, done=10)
    job.enter([0, 1, 3], 11, age_s=in_call_s, waiting_on={0: 3, 1: 0, 3: 2})
    snaps = {snap.rank: snap for snap in job.snapshots("status")}
    return JobStatuses(job.job, "127.0.0.1:1", job.t0, snaps, rdzv_world_size=job.n)


def _hang(found: Suspect, statuses: JobStatuses) -> Revocation:
    rank, kind, reason, peer, symptom = found
    return Revocation(kind, rank, reason, seen_by=0, via="watchdog", peer=peer, symptom=symptom)


def test_first_named_asks_until_a_record_is_named_within_its_bound() -> None:
    record = Revocation("hang", 2, "has not entered all_reduce seq 11", seen_by=0)
    answers = iter([None, None, record])
    clock = FakeClock()
    assert first_named(lambda: next(answers), 2.0, 0.5, clock.wait, clock) is record
    assert clock.waits == [0.5, 0.5]

    asked: list[float] = []
    clock = FakeClock()

    def never() -> None:
        asked.append(clock.now)

    assert first_named(never, 2.0, 0.5, clock.wait, clock) is None
    assert asked == [0.0, 0.5, 1.0, 1.5, 2.0]  # two status intervals, then it gives up
    assert first_named(never, 2.0, 0.5, lambda s: True, FakeClock()) is None  # closing


def test_a_hang_the_statuses_show_late_is_still_named_by_the_diagnosis() -> None:
    # the watchdog expired its call; under load the first statuses it reads show the ranks
    # in the call for a second only, the next ones show rank 2 holding them up
    key = FakeKey([_statuses(1.0), _statuses(1.0), _statuses(30.0)])
    end, _ = _end(key)
    try:
        named = end.name_hang(_hang)
    finally:
        end.close()
    assert named is not None and (named.origin, named.symptom) == (2, "not_entered")
    assert key.record is named and key.fetched == 3  # agreed with the job


def test_a_hang_nobody_is_named_for_falls_back_after_two_status_intervals() -> None:
    key = FakeKey([_statuses(1.0)])
    clock = FakeClock()
    end, _ = _end(key, clock)
    try:
        assert end.name_hang(_hang) is None
    finally:
        end.close()
    assert clock.now == 2.0 and key.record is None  # the front end's own view then


def test_the_job_s_record_wins_over_the_diagnosis() -> None:
    key = FakeKey([_statuses(30.0)])
    key.record = Revocation("died", 3, "process exited", seen_by=1)
    end, _ = _end(key)
    try:
        assert end.name_hang(_hang) is key.record
    finally:
        end.close()
    assert key.fetched == 0


def test_every_follower_gets_the_job_s_record_and_the_documents_carry_one() -> None:
    key = FakeKey()
    end, docs = _end(key)
    got: dict[str, list[Revocation]] = {"runtime": [], "torch": []}
    handed = {"runtime": threading.Event(), "torch": threading.Event()}
    carried: dict[str, Revocation | None] = {"runtime": None, "torch": None}

    def follower(name: str) -> Callable[[Revocation], None]:
        def handle(record: Revocation) -> None:
            got[name].append(record)
            carried[name] = record
            handed[name].set()

        return handle

    try:
        end.follow(follower("runtime"), lambda: carried["runtime"])
        assert docs.revoke_source is not None and docs.revoke_source() is None
        record = Revocation("hang", 2, "has not entered all_reduce seq 11", seen_by=1)
        key.records.put(record)
        # the torch front end follows after the record was handed on: it gets it at once
        assert handed["runtime"].wait(WAIT_S)
        leave = end.follow(follower("torch"), lambda: carried["torch"])
        assert handed["torch"].is_set()  # at once, on this thread
        assert got == {"runtime": [record], "torch": [record]}
        assert docs.revoke_source() is record
        carried["runtime"] = None  # a retry cleared the runtime's failure
        assert docs.revoke_source() is record  # the torch side still carries it
        leave()  # the torch front end ends: its record stays in the last documents
        assert docs.revoke_source() is record
        handed["runtime"].clear()
        end.renew()  # a retry began a new life; then an operator aborts the job
        again = Revocation("aborted", 1, "by the operator", seen_by=1)
        key.records.put(again)
        assert handed["runtime"].wait(WAIT_S)
        assert got == {"runtime": [record, again], "torch": [record]}
    finally:
        end.close()


def test_the_watchdog_names_the_diagnosed_rank_once_the_statuses_show_it() -> None:
    """The runtime's watchdog path (:meth:`Revoker.hang_origin`): rank 0's call waits on
    rank 3, its neighbour; the statuses show rank 2 holding the job up only at the third
    reading, and rank 2 is named; where they never do, the neighbour is, after two intervals."""
    rec = CollectiveRecord("0:0-3", 11, "all_reduce", start_ns=1)
    rec.waiting_on = 3
    for statuses, origin in (([_statuses(1.0), _statuses(1.0), _statuses(30.0)], 2), ([], 3)):
        key = FakeKey(statuses or [_statuses(1.0)])
        clock = FakeClock()
        end, _ = _end(key, clock)
        failure = FailureState(0, "0:0-3")
        try:
            revoker = Revoker(end, failure)  # type: ignore[arg-type]
            named = revoker.hang_origin(rec, failure.hang_record(rec))
        finally:
            end.close()
        assert (named.kind, named.origin, named.via) == ("hang", origin, "watchdog")
        assert key.record == named  # the job agrees on it
        assert clock.now == (1.0 if origin == 2 else 2.0)
