"""Verdicts come from a failed call's facts as fields (``CollectiveRecord.fault``), whatever its
error says; records without the field (older dumps) still get the verdict from their words."""

from __future__ import annotations

import json

import pytest
from diagnose_factory import T0, Job, revocation

from cclctl.call_fault import (
    LINK_BROKE,
    LINK_DROPPED,
    MISMATCH,
    PEER_FAILED,
    REVOKED,
    CallFault,
)
from cclctl.diagnose.engine import diagnose
from cclctl.diagnose.model import Verdict
from cclctl.errors import BadInput
from cclctl.records import FAILED, RankSnapshot, record_from_dict, snapshot_from_json

#: What the runtime's error said once, and what a reworded (or empty) one says now.
REWORDED = ("", "the words of this error changed")

BROADCAST_32 = "broadcast(float32, root 0, count 1024)"
BROADCAST_64 = "broadcast(float64, root 0, count 1024)"
OLD_MISMATCH = (
    f"collective mismatch: rank 2 called {BROADCAST_64} at seq 2 epoch 0 but peer 0 called "
    f"{BROADCAST_32} at seq 2 epoch 0"
)


def failed(job: Job, rank: int, seq: int, error: str, fault: CallFault | None, **kw: object) -> Job:
    return job.enter([rank], seq, state=FAILED, end_ns=1, age_s=1, error=error, fault=fault, **kw)


def outcome(verdicts: list[Verdict]) -> list[tuple[object, ...]]:
    """A verdict without its evidence (which quotes the error's words)."""
    return [(v.kind, v.ranks, v.seq, v.link, v.summary) for v in verdicts]


def mismatch_job(words: str | None) -> list[RankSnapshot]:
    """Rank 2 called broadcast in float64; only its error says what rank 0 called."""
    job = Job(8, done=1, op="broadcast").complete([0, 1, 3, 4, 5, 6, 7], 5)
    theirs = CallFault(MISMATCH, peer=0, mine=BROADCAST_64, theirs=BROADCAST_32, their_seq=2)
    error = OLD_MISMATCH if words is None else words
    failed(job, 2, 2, error, None if words is None else theirs, op="broadcast", root=0)
    job.ranks[2].records[-1].dtype = "float64"
    job.enter([0, 1, 5, 6], op="broadcast", root=0, waiting_on={0: 3, 1: 0, 5: 1, 6: 5})
    for rank in (3, 4, 7):
        old = f"rank {rank}: shared-memory link to rank 2 broke in x: rank 2 failed"
        fault = None if words is None else CallFault(PEER_FAILED, peer=2)
        failed(job, rank, 6, old if words is None else words, fault)
    statuses = job.snapshots("status")
    for snap in statuses:  # a status holds the calls in flight and the last finished one
        snap.records = snap.records[-2:]
    return statuses


def dropped_job(words: str | None) -> list[RankSnapshot]:
    job = Job(4).enter([0, 2, 3], waiting_on={0: 1, 2: 1, 3: 2})
    old = "rank 1: link to rank 0 was dropped before all_reduce(...) at seq 11"
    fault = None if words is None else CallFault(LINK_DROPPED, peer=0)
    failed(job, 1, 11, old if words is None else words, fault)
    return job.snapshots("status")


def broke_job(words: str | None) -> list[RankSnapshot]:
    job = Job(4).enter([0, 1], waiting_on={0: 3, 1: 0})
    old = "rank 2: link to rank 3 broke while receiving from it in x: reset"
    fault = None if words is None else CallFault(LINK_BROKE, peer=3, direction="recv")
    failed(job, 2, 11, old if words is None else words, fault)
    return job.snapshots("status")


def revoked_job(words: str | None) -> list[RankSnapshot]:
    """Ranks 1 and 3 were revoked by rank 2's failure; rank 2 left with its own error."""
    job = Job(4).enter([0], waiting_on={0: 1})
    for rank in (1, 3):
        old = f"rank {rank}: all_reduce(float32) seq 11 revoked: rank 2 (pid 7 on vm) failed: x"
        fault = None if words is None else CallFault(REVOKED, origin=2)
        failed(job, rank, 11, old if words is None else words, fault)
    failed(job, 2, 11, "rank 2: something went wrong in its own code", None)
    return job.snapshots("status")


JOBS = {"mismatch": mismatch_job, "dropped": dropped_job, "broke": broke_job}
JOBS["revoked"] = revoked_job
PROC = {"broke": {3: "gone"}}


@pytest.mark.parametrize("words", REWORDED)
@pytest.mark.parametrize("name", sorted(JOBS))
def test_a_reworded_error_with_its_facts_as_fields_gives_the_same_verdict(name, words):
    proc = PROC.get(name, {})
    before = outcome(diagnose(JOBS[name](None), now_ns=T0, proc=proc).verdicts)
    after = outcome(diagnose(JOBS[name](words), now_ns=T0, proc=proc).verdicts)
    assert after == before
    assert before[0][0] in ("mismatch", "link", "dead", "stuck")


@pytest.mark.parametrize("name", sorted(JOBS))
def test_a_dump_keeps_the_facts_and_an_older_dump_without_them_reads_as_before(name):
    proc = PROC.get(name, {})
    old = outcome(diagnose(JOBS[name](None), now_ns=T0, proc=proc).verdicts)
    written = [json.loads(s.to_json()) for s in JOBS[name]("reworded")]
    read = [snapshot_from_json(json.dumps(doc)) for doc in written]
    assert any(r.fault is not None for s in read for r in s.records)
    assert outcome(diagnose(read, now_ns=T0, proc=proc).verdicts) == old
    older = [json.loads(s.to_json()) for s in JOBS[name](None)]
    assert not any("fault" in r for doc in older for r in doc["records"])  # as before
    read = [snapshot_from_json(json.dumps(doc)) for doc in older]
    assert outcome(diagnose(read, now_ns=T0, proc=proc).verdicts) == old


def test_fields_win_over_words_that_name_another_peer():
    job = Job(4).enter([0, 2, 3], waiting_on={0: 1, 2: 1, 3: 2})
    failed(job, 1, 11, "rank 1: link to rank 3 was dropped", CallFault(LINK_DROPPED, peer=0))
    verdict = diagnose(job.snapshots("status"), now_ns=T0).verdicts[0]
    assert (verdict.kind, verdict.link) == ("link", (0, 1))


@pytest.mark.parametrize(
    "fault",
    [
        {"kind": "bogus"},
        {"kind": "timeout", "peer": -3},
        {"kind": "timeout", "peer": True},
        {"kind": "link_broke", "direction": "sideways"},
        {"kind": "mismatch", "theirs": 7},
        "timeout",
    ],
)
def test_an_unusable_fault_is_refused(fault):
    with pytest.raises(BadInput, match="fault"):
        record_from_dict({"comm": "c", "seq": 1, "op": "all_reduce", "fault": fault})


def test_a_fault_reads_back_as_written():
    fault = CallFault(MISMATCH, peer=3, mine="a(x)", theirs="b(y)", their_seq=4)
    rec = record_from_dict({"comm": "c", "seq": 4, "op": "a", "fault": fault.to_dict()})
    assert rec.fault == fault
    assert record_from_dict({"comm": "c", "seq": 4, "op": "a", "fault": None}).fault is None


@pytest.mark.parametrize("reason", ["is stopped (process state T)", "is frozen, in new words"])
def test_a_hang_record_names_its_symptom_as_a_field(reason):
    """The watchdog's record says the origin was stopped; its reason's words do not matter
    (a record written before the field existed is read by them)."""
    proc = {0: "running", 1: "running", 2: "running", 3: "stopped"}
    record = revocation("hang", 3, reason, seen_by=0, via="watchdog", symptom="stopped")
    verdict = next(
        v
        for v in diagnose(Job(4).revoke(range(4), record).snapshots(), proc=proc).verdicts
        if v.ranks == "3"
    )
    assert verdict.kind == "stopped"
    assert verdict.next_step.startswith("kill -CONT 1003 on host-0")
    older = revocation("hang", 3, "is stopped (process state T)", seen_by=0, via="watchdog")
    diag = diagnose(Job(4).revoke(range(4), older).snapshots(), proc=proc)
    assert next(v for v in diag.verdicts if v.ranks == "3").kind == "stopped"
