"""What real jobs leave behind: lagging statuses of dead ranks, closed ranks, failed calls
whose errors (in the runtime's own words) are the only record of a peer or a link.
"""

from __future__ import annotations

from typing import Any

from diagnose_factory import T0, Job, ring_left

from cclctl.diagnose.engine import diagnose
from cclctl.diagnose.model import Verdict
from cclctl.records import FAILED, STARTED, CommInfo


def kinds(verdicts: list[Verdict]) -> list[tuple[str, str]]:
    return [(v.kind, v.ranks) for v in verdicts]


def lagging(job: Job, rank: int) -> Job:
    """Rank's last status was published before it ran anything (it died soon after)."""
    state = job.ranks[rank]
    state.comms = {name: CommInfo(info.ranks, 0, 0) for name, info in state.comms.items()}
    state.records = []
    return job.stale([rank], 1.5)


def failed(job: Job, rank: int, seq: int, error: str, **fields: Any) -> Job:
    return job.enter([rank], seq, state=FAILED, end_ns=1, age_s=1, error=error, **fields)


def test_closed_ranks_of_a_finished_job_are_healthy():
    job = Job(4)
    for rank in range(4):
        job.ranks[rank].age_s = 30
    statuses = job.snapshots("status")
    for snap in statuses:
        snap.reason = "closed"
    diag = diagnose(statuses, now_ns=T0, proc=dict.fromkeys(range(4), "gone"))
    assert kinds(diag.verdicts) == [("healthy", "")]


def test_a_rank_that_closed_while_others_wait_never_entered():
    job = Job(4).enter([0, 1, 2], waiting_on=ring_left(4))
    statuses = job.snapshots("status")
    statuses[3].reason = "closed"
    diag = diagnose(statuses, now_ns=T0, proc={3: "gone"})
    assert kinds(diag.verdicts) == [("not_entered", "3")]
    assert "rank 3 closed its communicators and finished instead" in diag.verdicts[0].evidence


def test_dead_rank_ties_to_the_call_the_others_wait_in_before_it_counts_as_hung():
    job = Job(4).enter([0, 1], age_s=0.3, waiting_on={0: 3, 1: 0}).enter([3], age_s=0.3)
    diag = diagnose(job.snapshots("status"), now_ns=T0, proc={3: "zombie"})
    assert kinds(diag.verdicts) == [("dead", "3")]  # rank 2, merely slow, is not named
    assert (diag.verdicts[0].comm, diag.verdicts[0].seq) == ("0:0-3", 11)


def test_a_lagging_status_is_corrected_by_what_the_others_completed():
    """All ranks completed all_reduce seq 10, so rank 1 took part in it, whatever its last
    status (published before seq 1) says; it is the call after that it never entered.
    """
    job = lagging(Job(4).enter([0, 2, 3], age_s=0.5, waiting_on={0: 3, 2: 1, 3: 2}), 1)
    verdict = diagnose(job.snapshots("status"), now_ns=T0, proc={1: "zombie"}).verdicts[0]
    assert (verdict.kind, verdict.ranks, verdict.seq) == ("dead", "1", 11)
    assert "rank 1 took part in seq 10 (the others completed all_reduce seq 10 of comm 0:0-3)" in (
        verdict.evidence
    )


def test_a_stopped_rank_last_seen_inside_an_early_call_is_placed_where_the_others_wait():
    """Rank 1's last status shows it inside all_gather seq 1; the others completed
    all_reduce seq 10 since, so it took part in that, and the call it never entered is 11.
    Nothing says whom the others wait on (torch's gloo does not tell).
    """
    job = Job(4).enter([0, 2, 3], age_s=5)
    state = job.ranks[1]
    state.comms = {job.world: CommInfo(list(range(4)), 1, 0)}
    state.records = [job._record(1, job.world, 1, "all_gather", STARTED, 20)]
    job.stale([1], 15)
    verdict = diagnose(job.snapshots("status"), now_ns=T0, proc={1: "stopped"}).verdicts[0]
    place = (verdict.kind, verdict.ranks, verdict.seq, verdict.op)
    assert place == ("stopped", "1", 11, "all_reduce")
    assert "rank 1 never entered all_reduce seq 11 of comm 0:0-3" in verdict.evidence


def test_a_lagging_status_and_nothing_else_leaves_the_place_open():
    job = lagging(Job(4, done=0), 2)
    verdict = diagnose(job.snapshots("status"), now_ns=T0, proc={2: "gone"}).verdicts[0]
    assert (verdict.kind, verdict.seq) == ("dead", None)


def test_mismatch_known_only_from_the_failed_ranks_error():
    """Live statuses keep each rank's last call only; the mismatch error names the peer's."""
    error = (
        "collective mismatch: rank 2 called broadcast(float64, root 0, count 1024) at seq 2 "
        "epoch 0 but peer 0 called broadcast(float32, root 0, count 1024) at seq 2 epoch 0"
    )
    job = Job(8, done=1, op="broadcast").complete([0, 1, 3, 4, 5, 6, 7], 5)
    failed(job, 2, 2, error, op="broadcast", dtype="float64", root=0)
    job.enter([0, 1, 5, 6], op="broadcast", root=0, waiting_on={0: 3, 1: 0, 5: 1, 6: 5})
    for rank in (3, 4, 7):
        failed(job, rank, 6, f"rank {rank}: shared-memory link to rank 2 broke in x: rank 2 failed")
    statuses = job.snapshots("status")
    for snap in statuses:  # a status holds the calls in flight and the last finished one
        snap.records = snap.records[-2:]
    diag = diagnose(statuses, now_ns=T0)
    verdict = diag.verdicts[0]
    assert (verdict.kind, verdict.ranks, verdict.seq) == ("mismatch", "2", 2)
    assert verdict.summary == (
        "rank 2 called broadcast(float64 x 1024, root 0) where ranks 0-1,3-7 called "
        "broadcast(float32 x 1024, root 0) at seq 2 of comm 0:0-7"
    )
    assert (
        "ranks 1,3-7 completed seq 2, so they called what the ranks they exchanged with called"
        in (verdict.evidence)
    )
    assert kinds(diag.verdicts) == [("mismatch", "2")]


def test_a_dropped_link_is_named_by_the_rank_that_dropped_it():
    job = Job(4).enter([0, 2, 3], waiting_on={0: 1, 2: 1, 3: 2})
    failed(job, 1, 11, "rank 1: link to rank 0 was dropped before all_reduce(...) at seq 11")
    verdict = diagnose(job.snapshots("status"), now_ns=T0).verdicts[0]
    assert (verdict.kind, verdict.link, verdict.seq) == ("link", (0, 1), 11)
    assert "rank 1's call failed: rank 1: link to rank 0 was dropped" in verdict.evidence[0]


def test_a_link_to_a_dead_rank_is_the_dead_ranks_doing():
    job = Job(4).enter([0, 1], waiting_on={0: 3, 1: 0})
    failed(job, 2, 11, "rank 2: link to rank 3 broke while receiving from it in x: reset")
    diag = diagnose(job.snapshots("status"), now_ns=T0, proc={3: "gone"})
    assert kinds(diag.verdicts) == [("dead", "3")]
    assert "rank 2's call failed: rank 2: link to rank 3 broke while receiving" in " ".join(
        diag.verdicts[0].evidence
    )


def test_peer_failure_errors_are_followed_to_the_failed_rank():
    """shm: 'link to rank 2 broke in ...: rank 2 failed' means wait on rank 2, not a link."""
    job = Job(4).enter([0], waiting_on={0: 1})
    failed(job, 1, 11, "rank 1: shared-memory link to rank 2 broke in x: rank 2 failed")
    failed(job, 3, 11, "rank 3: shared-memory link to rank 2 broke in x: rank 2 failed")
    failed(job, 2, 11, "rank 2: something went wrong in its own code")
    verdict = diagnose(job.snapshots("status"), now_ns=T0).verdicts[0]
    assert (verdict.kind, verdict.ranks) == ("stuck", "2")
    assert verdict.summary == "rank 2 left all_reduce seq 11 of comm 0:0-3 with an error"
