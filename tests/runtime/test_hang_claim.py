"""One diagnoser per hang: with every rank's watchdog expiring the same call at once, one
rank lists the job's statuses and diagnoses; the others take its record. A claimer that
never delivers (it died) is taken over by one of them.

Real revoke ends against a real store, in this process; each rank's listing of the job's
statuses is counted (and answers planted statuses: rank 2 never entered the call).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import ClassVar

import pytest
from diagnose_factory import Job

from cclctl.config import RuntimeConfig
from cclctl.live.snapshot import JobStatuses
from cclctl.revocation import Revocation
from cclctl.runtime.job.hang_claim import claim_key
from cclctl.runtime.job.revoke_end import JobRevokeEnd, Suspect
from cclctl.runtime.job.revoke_key import RevokeKey
from cclctl.store.client import StoreClient
from cclctl.store.scope import ScopedStore
from cclctl.store.server import StoreServer

pytestmark = pytest.mark.timeout(60)
JOB = "claimjob"
RANKS = 8
HANG = "0:0-3/0/all_reduce/11"


def _statuses() -> JobStatuses:
    """Ranks 0, 1 and 3 in all_reduce seq 11 for 30 s; rank 2 never entered it."""
    job = Job(4, done=10)
    job.enter([0, 1, 3], 11, age_s=30.0, waiting_on={0: 3, 1: 0, 3: 2})
    snaps = {snap.rank: snap for snap in job.snapshots("status")}
    return JobStatuses(job.job, "127.0.0.1:1", job.t0, snaps, rdzv_world_size=job.n)


class _CountedKey(RevokeKey):
    """A rank's real key whose listing of the job's statuses is counted (and planted)."""

    listings: ClassVar[list[int]] = []
    lock = threading.Lock()

    def statuses(self) -> JobStatuses:
        with self.lock:
            self.listings.append(self.rank)
        return _statuses()


class _Documents:
    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.cfg = RuntimeConfig(timeout_s=2.0, status_interval_s=0.2)
        self.revoke_source: Callable[[], Revocation | None] | None = None


@pytest.fixture
def ends() -> Iterator[tuple[list[JobRevokeEnd], ScopedStore]]:
    _CountedKey.listings = []
    with StoreServer() as server, StoreClient("127.0.0.1", server.port, timeout_s=10) as client:
        made = [
            JobRevokeEnd(_CountedKey(server.address, "", JOB, rank), _Documents(rank))
            for rank in range(RANKS)
        ]
        try:
            yield made, ScopedStore.for_job(client, JOB)
        finally:
            for end in made:
                end.close()


def _build(seen_by: int) -> Callable[[Suspect, JobStatuses], Revocation]:
    def build(found: Suspect, statuses: JobStatuses) -> Revocation:
        rank, kind, reason, peer, symptom = found
        return Revocation(kind, rank, reason, seen_by=seen_by, via="watchdog", peer=peer,
                          symptom=symptom)  # fmt: skip

    return build


def _expire_all(ends: list[JobRevokeEnd]) -> list[Revocation | None]:
    """Every rank's watchdog expires the call at once; what each one names."""
    named: list[Revocation | None] = [None] * len(ends)
    start = threading.Barrier(len(ends))

    def expire(i: int) -> None:
        start.wait()
        named[i] = ends[i].name_hang(_build(i), HANG)

    threads = [threading.Thread(target=expire, args=(i,)) for i in range(len(ends))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert not any(thread.is_alive() for thread in threads)
    return named


def test_with_every_rank_hung_one_lists_and_diagnoses_and_all_name_its_origin(ends) -> None:
    made, _ = ends
    named = _expire_all(made)
    assert len(_CountedKey.listings) == 1  # one listing of the job, one diagnosis
    (claimer,) = _CountedKey.listings
    assert {(r.kind, r.origin, r.seen_by) for r in named if r} == {("hang", 2, claimer)}
    assert all(r is not None for r in named)
    parts = [end.last_claim for end in made]
    assert [i for i, p in enumerate(parts) if p and p.diagnosed] == [claimer]


def test_a_claimer_that_died_is_taken_over_by_one_waiter(ends) -> None:
    """Rank 9 claimed the hang and died before it delivered; after its lease one of the
    waiting ranks takes the claim over and diagnoses, once, for all of them."""
    made, store = ends
    dead = b'{"rank": 9, "pid": 1, "time_ns": 1}'
    assert store.compare_set(claim_key(HANG), None, dead) == dead
    for end in made:
        end.claim_lease_s = 0.5
    named = _expire_all(made)
    assert len(_CountedKey.listings) == 1
    (taker,) = _CountedKey.listings
    assert {(r.kind, r.origin, r.seen_by) for r in named if r} == {("hang", 2, taker)}
    assert all(r is not None for r in named)
    assert store.try_get(claim_key(HANG)) != dead


class _Keys:
    """A claim's store: keys in a dict."""

    def __init__(self) -> None:
        self.keys: dict[str, bytes] = {}

    def compare_set(self, key: str, expected: bytes | None, desired: bytes) -> bytes:
        if self.keys.get(key) == expected:
            self.keys[key] = desired
        return self.keys[key]

    def set(self, key: str, value: bytes) -> None:
        self.keys[key] = value

    def try_get(self, key: str) -> bytes | None:
        return self.keys.get(key)


@pytest.mark.parametrize("claimer_through", [True, False])
def test_a_waiter_goes_on_once_the_claimer_is_through_naming_nobody(claimer_through) -> None:
    """A claimer that named nobody is through by the end of its asking: its waiters go on
    then, not at the lease's end; a claimer not through then is waited for the rest of
    the lease, and then taken over."""
    from cclctl.runtime.job.hang_claim import HangClaim

    keys = _Keys()
    HangClaim(keys, 0, HANG, lease_s=14.0, soon_s=2.0).take(None)  # rank 0 holds the claim
    if claimer_through:
        HangClaim(keys, 0, HANG, lease_s=14.0).finish()  # ... and named nobody
    waits: list[float] = []

    def handed(timeout_s: float) -> Revocation | None:
        waits.append(timeout_s)  # no record comes
        return None

    waiter = HangClaim(keys, 5, HANG, lease_s=14.0, soon_s=2.0)
    result = waiter.run(lambda: "diagnosed by 5", lambda: None, handed)
    if claimer_through:
        assert (result, waits) == (None, [2.0])
    else:
        assert (result, waits) == ("diagnosed by 5", [2.0, 12.0])  # the rest, then taken over
