"""Follow-on failures without revoke records: the breaks a dead or failed rank (or one cut
link) caused are its evidence, never verdicts of their own; finished ranks are done.

The errors are the runtime's own words (TCP's "link to rank 6 broke while receiving from
it", shared memory's "rank 2 failed"), as a post-mortem on TCP reads them.
"""

from __future__ import annotations

from diagnose_factory import NS, T0, Job

from cclctl.diagnose.engine import diagnose
from cclctl.diagnose.model import Verdict
from cclctl.records import FAILED, TIMED_OUT

CALL = "all_reduce(float32, sum, count 1024) seq 11"


def kinds(verdicts: list[Verdict]) -> list[tuple[str, str]]:
    return [(v.kind, v.ranks) for v in verdicts]


def broke(job: Job, rank: int, peer: int, *, seq: int = 11, failed_s: float = 1.0) -> Job:
    """``rank``'s call at ``seq`` failed ``failed_s`` before its dump: its link to ``peer``
    broke (TCP's words)."""
    error = (
        f"rank {rank}: link to rank {peer} broke while receiving from it in {CALL}: "
        "Connection reset by peer"
    )
    end = -int(failed_s * NS)
    return job.enter([rank], seq, state=FAILED, age_s=failed_s + 1, end_ns=end, error=error)


def test_a_cut_link_is_named_once_not_as_every_pair_that_saw_the_cascade():
    """8 ranks, link 6<->7 cut: 6 and 7 blame each other first; every other rank failed
    because a peer of it had failed, and blames that peer."""
    job = Job(8)
    broke(job, 6, 7, failed_s=5.0)
    broke(job, 7, 6, failed_s=5.0)
    for rank, peer in {0: 4, 1: 5, 2: 6, 3: 7, 4: 6, 5: 7}.items():
        broke(job, rank, peer, failed_s=4.0)
    diag = diagnose(job.snapshots())
    assert kinds(diag.verdicts) == [("link", "6-7")]
    verdict = diag.verdicts[0]
    assert (verdict.link, verdict.seq) == ((6, 7), 11)
    assert "rank 6's call failed: rank 6: link to rank 7 broke" in verdict.evidence[0]
    assert any(line.startswith("rank 2's call failed: rank 2: link to rank 6") for line in (
        verdict.evidence
    ))  # fmt: skip
    assert "ranks 0-1 failed after peers that had failed" in " ".join(verdict.evidence)


def test_of_two_pairs_that_blame_each_other_the_first_break_is_the_link():
    """Two pairs blame each other at the same seq: the one that failed first is the link,
    the other is its evidence (each end's own clock: a tie-break after the seq)."""
    job = Job(8).enter([1, 2, 3, 5], waiting_on={1: 0, 2: 6, 3: 7, 5: 4})
    broke(job, 6, 7, failed_s=5.0)
    broke(job, 7, 6, failed_s=5.0)
    broke(job, 0, 4, failed_s=2.0)
    broke(job, 4, 0, failed_s=2.0)
    diag = diagnose(job.snapshots())
    assert kinds(diag.verdicts) == [("link", "6-7")]
    assert "links 0<->4 broke after it" in " ".join(diag.verdicts[0].evidence)


def test_the_first_break_is_found_by_seq_before_time():
    """A pair at a later seq failed earlier by its clock; the seq decides."""
    job = Job(8).complete([0, 4], 11).enter([1, 2, 3, 5], waiting_on={1: 0, 2: 6, 3: 7, 5: 4})
    broke(job, 6, 7, failed_s=1.0)
    broke(job, 7, 6, failed_s=1.0)
    broke(job, 0, 4, seq=12, failed_s=9.0)
    broke(job, 4, 0, seq=12, failed_s=9.0)
    verdicts = diagnose(job.snapshots()).verdicts
    assert [(v.kind, v.link, v.seq) for v in verdicts] == [("link", (6, 7), 11)]


def test_a_killed_rank_is_the_verdict_and_its_peers_breaks_are_its_evidence():
    """Rank 6 was killed (no dump); rank 0 saw its link to rank 7 break because rank 7 had
    failed on rank 6: that is no link of its own."""
    job = Job(8)
    for rank, peer in {7: 6, 5: 6, 2: 6}.items():
        broke(job, rank, peer, failed_s=3.0)
    for rank, peer in {0: 7, 4: 5, 1: 0, 3: 2}.items():
        broke(job, rank, peer, failed_s=2.0)
    diag = diagnose(job.snapshots(without=[6]))
    assert kinds(diag.verdicts) == [("missing", "6")]
    evidence = " ".join(diag.verdicts[0].evidence)
    assert "rank 7's call failed: rank 7: link to rank 6 broke" in evidence
    assert "ranks 0-1,3-4 failed after peers that had failed" in evidence


def test_live_a_dead_rank_explains_every_break():
    job = Job(8)
    for rank in range(8):
        if rank != 6:
            broke(job, rank, 6 if rank in (2, 5, 7) else (rank + 1) % 8)
    diag = diagnose(job.snapshots("status"), now_ns=T0, proc={6: "gone"})
    assert kinds(diag.verdicts) == [("dead", "6")]


def test_a_rank_that_failed_by_itself_is_the_verdict_not_its_links():
    job = Job(4)
    error = f"rank 2: {CALL} failed: ValueError: buffer is not contiguous"
    job.enter([2], state=FAILED, age_s=3, end_ns=-2 * NS, error=error)
    broke(job, 1, 2)
    broke(job, 3, 2)
    broke(job, 0, 1)
    diag = diagnose(job.snapshots())
    assert kinds(diag.verdicts) == [("stuck", "2")]
    verdict = diag.verdicts[0]
    assert verdict.summary == "rank 2 left all_reduce seq 11 of comm 0:0-3 with an error"
    assert "rank 3's call failed: rank 3: link to rank 2 broke" in " ".join(verdict.evidence)


def test_ranks_waiting_on_a_rank_that_left_are_evidence_not_suspects():
    job = Job(4).complete([3], 11).enter([0, 1, 2], waiting_on={0: 3, 1: 3, 2: 3})
    verdict = diagnose(job.snapshots()).verdicts[0]
    assert (verdict.kind, verdict.ranks) == ("stuck", "3")
    assert "ranks 0-2 wait on rank 3 in all_reduce seq 11 of comm 0:0-3" in verdict.evidence


def test_finished_ranks_are_done_not_missing_dead_or_stale():
    job = Job(4).finish(range(4)).stale(range(4), 60)
    live = diagnose(job.snapshots("status"), now_ns=T0, proc=dict.fromkeys(range(4), "gone"))
    assert kinds(live.verdicts) == [("healthy", "")]
    assert kinds(diagnose(job.snapshots("status")).verdicts) == [("healthy", "")]


def test_a_rank_that_finished_while_others_wait_never_entered():
    job = Job(4).enter([0, 1, 2], waiting_on={0: 3, 1: 0, 2: 1}).finish([3])
    diag = diagnose(job.snapshots(), proc={3: "gone"})
    assert kinds(diag.verdicts) == [("not_entered", "3")]
    assert "rank 3 closed its communicators and finished instead" in diag.verdicts[0].evidence


def test_a_revoked_call_blames_the_origin_its_error_names():
    """A document without the record (written before the rank adopted it, or by a reader
    that drops it) still names the origin in the revoked call's error."""
    job = Job(4)
    for rank in range(3):
        error = f"rank {rank}: {CALL} revoked: rank 3 (pid 1003 on host-0) died (SIGKILL)"
        job.enter([rank], state=FAILED, age_s=2, end_ns=-NS, error=error)
    diag = diagnose(job.snapshots(without=[3]))
    assert kinds(diag.verdicts) == [("missing", "3")]
    assert "ranks 0-2: the call was revoked by this failure" in diag.verdicts[0].evidence


def test_a_link_whose_far_end_still_waits_is_placed_where_that_end_waits():
    """A cut link 6<->7 in a broadcast pipeline: rank 7 still waits (timed out) in seq 3,
    rank 6 failed sending to it at seq 4, then 5 and 4 failed on their links downstream
    (rank 4 had been waiting on rank 3 before: stale, not whom its failure blames); ranks
    0-3 finished cleanly."""
    job = Job(8, done=2).complete([0, 1, 2, 3], 8).finish([0, 1, 2, 3])
    job.complete([4], 7).complete([5], 5).complete([6], 3)
    timeout = "rank 7: all_reduce seq 3 timed out after 2.1s waiting to recv from rank 6"
    job.enter([7], 3, state=TIMED_OUT, waiting_on={7: 6}, error=timeout)
    broke(job, 6, 7, seq=4, failed_s=9)
    broke(job, 5, 6, seq=6, failed_s=5)
    job.enter([4], 8, state=FAILED, waiting_on={4: 3}, end_ns=-NS, error=(
        f"rank 4: link to rank 5 broke while sending to it in {CALL}: reset"
    ))  # fmt: skip
    verdicts = diagnose(job.snapshots()).verdicts
    assert [(v.kind, v.link, v.seq) for v in verdicts] == [("link", (6, 7), 3)]
    assert "rank 4 failed after a peer that had failed" in " ".join(verdicts[0].evidence)
