"""Documents that carry the job's revoke record: its origin is the one verdict, and every
other rank's failure (the breaks, the waits, the dumps that are missing) is its evidence.
"""

from __future__ import annotations

import json

from diagnose_factory import NS, T0, Job, revocation, world

from cclctl.diagnose.engine import diagnose
from cclctl.diagnose.model import Verdict
from cclctl.records import FAILED, snapshot_from_json
from cclctl.revocation import OPERATOR

CALL = "all_reduce(float32, sum, count 1024) seq 11"


def kinds(verdicts: list[Verdict]) -> list[tuple[str, str]]:
    return [(v.kind, v.ranks) for v in verdicts]


def revoked_call(job: Job, ranks: list[int], reason: str, *, seq: int = 11) -> Job:
    """``ranks``' calls at ``seq`` ended with the revoke error (their own words)."""
    for rank in ranks:
        error = f"rank {rank}: {CALL} revoked: {reason}"
        job.enter([rank], seq, state=FAILED, age_s=2, end_ns=-NS, error=error)
    return job


def killed_rank_6() -> tuple[Job, list[int]]:
    """8 ranks on TCP, rank 6 SIGKILLed: every survivor adopted the record rank 3 wrote,
    and some calls also failed on their links to rank 6 or to a failing peer."""
    record = revocation("died", 6, "SIGKILL", comm=world(8), seen_by=3, via="pidfd")
    job = Job(8)
    survivors = [0, 1, 2, 3, 4, 5, 7]
    for rank, peer in {7: 6, 2: 6, 0: 7, 4: 5}.items():
        error = f"rank {rank}: link to rank {peer} broke while receiving from it in {CALL}: reset"
        job.enter([rank], state=FAILED, age_s=2, end_ns=-NS, error=error)
    revoked_call(job, [1, 3, 5], record.describe())
    return job.revoke(survivors, record), survivors


def test_a_died_record_names_the_dead_rank_and_nothing_else():
    job, _ = killed_rank_6()
    diag = diagnose(job.snapshots(without=[6]))
    assert kinds(diag.verdicts) == [("dead", "6")]
    verdict = diag.verdicts[0]
    assert verdict.origin
    assert verdict.summary == "rank 6 is dead: SIGKILL (seen by rank 3)"
    assert (verdict.suspects[0].host, verdict.suspects[0].pid) == ("host-1", 1006)
    assert (verdict.comm, verdict.seq, verdict.op) == ("0:0-7", 11, "all_reduce")
    evidence = " ".join(verdict.evidence)
    assert verdict.evidence[0] == (
        "the job's revoke record: rank 6 (pid 1006 on host-1) died (SIGKILL, seen by rank 3) in "
        "all_reduce seq 11 of comm 0:0-7"
    )
    assert "ranks 0-5,7 adopted this failure (the same record)" in evidence
    assert "rank 7's call failed: rank 7: link to rank 6 broke" in evidence
    assert "also: rank 6 left no dump" in evidence
    assert "ranks 1,3,5: the call was revoked by this failure" in evidence


def test_the_verdict_does_not_depend_on_the_order_of_the_documents():
    job, _ = killed_rank_6()
    snaps = job.snapshots(without=[6])
    first = diagnose(snaps).to_dict()
    assert diagnose(list(reversed(snaps))).to_dict() == first


def test_records_survive_the_json_of_a_dump():
    job, _ = killed_rank_6()
    snaps = [snapshot_from_json(s.to_json()) for s in job.snapshots(without=[6])]
    assert kinds(diagnose(snaps).verdicts) == [("dead", "6")]


def test_a_link_record_names_the_link():
    record = revocation("link", 6, "connection reset", peer=7, comm=world(8), seen_by=6)
    job = Job(8)
    for rank, peer in {0: 4, 1: 5, 2: 6, 3: 7, 6: 7, 7: 6}.items():
        error = f"rank {rank}: link to rank {peer} broke while receiving from it in {CALL}: reset"
        job.enter([rank], state=FAILED, age_s=2, end_ns=-NS, error=error)
    job.enter([4, 5], waiting_on={4: 6, 5: 7}).revoke(range(8), record)
    diag = diagnose(job.snapshots())
    assert kinds(diag.verdicts) == [("link", "6-7")]
    assert diag.verdicts[0].link == (6, 7)
    assert diag.verdicts[0].summary == "link 6<->7 broke: connection reset (seen by rank 6)"


def test_a_mismatch_record_names_the_mismatched_rank_with_the_calls_as_evidence():
    reason = (
        "called broadcast(float32, root 0, count 1024) at seq 11 where rank 0 called all_reduce"
    )
    record = revocation("mismatch", 2, reason, seen_by=0)
    job = Job(4).enter([2], op="broadcast", root=0).enter([0, 1, 3], waiting_on={0: 2, 1: 0, 3: 2})
    diag = diagnose(job.revoke(range(4), record).snapshots())
    assert kinds(diag.verdicts) == [("mismatch", "2")]
    verdict = diag.verdicts[0]
    assert verdict.summary == f"rank 2 {reason} (seen by rank 0)"
    assert "rank 2 called broadcast(float32 x 1024, root 0)" in verdict.evidence


def test_a_hang_record_takes_the_verdict_the_hang_analysis_gives_its_origin():
    """The watchdog named rank 3 (the rank the others wait on): the frontier check finds
    it never entered the call; that verdict is the origin's, with the record as evidence."""
    reason = "never entered all_reduce seq 11 (the others waited 60.0s)"
    record = revocation("hang", 3, reason, seen_by=0, via="watchdog")
    job = Job(4).enter([0, 1, 2], waiting_on={0: 3, 1: 0, 2: 1}).revoke([0, 1, 2], record)
    diag = diagnose(job.snapshots())
    assert kinds(diag.verdicts) == [("not_entered", "3")]
    verdict = diag.verdicts[0]
    assert verdict.origin and verdict.seq == 11
    assert verdict.evidence[0].startswith("the job's revoke record: rank 3 (pid 1003 on host-0)")
    assert "seen by rank 0's watchdog" in verdict.evidence[0]
    assert "rank 3 had adopted no failure when they last wrote" in verdict.evidence


def test_a_hang_record_whose_origin_no_check_names_is_its_own_verdict():
    record = revocation("hang", 3, "stopped answering in all_reduce seq 11", via="watchdog")
    job = Job(4).revoke(range(4), record)
    diag = diagnose(job.snapshots())
    assert kinds(diag.verdicts) == [("stuck", "3")]
    assert diag.verdicts[0].summary == (
        "rank 3 stopped answering in all_reduce seq 11 (seen by rank 0's watchdog)"
    )


def test_a_death_by_sigterm_after_a_hang_is_the_teardown_not_the_verdict():
    """A job hung on rank 3, which never entered seq 11; whoever stopped it SIGTERMed the
    ranks, and rank 1 died first: its peers' record says so, but the hang is the verdict."""
    record = revocation("died", 1, "SIGTERM", seen_by=2, via="pidfd")
    job = Job(4).enter([0, 1, 2], waiting_on={0: 3, 1: 0, 2: 1}).revoke([0, 2], record)
    diag = diagnose(job.snapshots())
    assert kinds(diag.verdicts) == [("not_entered", "3")]
    assert not diag.verdicts[0].origin
    assert (
        "then the job was stopped: rank 1 (pid 1001 on host-0) died (SIGTERM, seen by rank 2)"
        in diag.verdicts[0].evidence
    )


def test_a_death_by_sigterm_with_nothing_before_it_is_the_verdict():
    record = revocation("died", 1, "SIGTERM", seen_by=2, via="pidfd")
    job = Job(4).revoke([0, 2, 3], record)
    diag = diagnose(job.snapshots(without=[1]))
    assert kinds(diag.verdicts) == [("dead", "1")]
    assert diag.verdicts[0].summary == "rank 1 is dead: SIGTERM (seen by rank 2)"


def test_an_operator_abort_blames_no_rank():
    record = revocation(
        "aborted", OPERATOR, "stuck since noon", comm="", seq=None, op=None,
        seen_by=OPERATOR, via="operator", by="root@head",
    )  # fmt: skip
    job = Job(4).enter([0, 1, 2], waiting_on={0: 3, 1: 0, 2: 1}).revoke([0, 1, 2], record)
    diag = diagnose(job.snapshots("status"), now_ns=T0, proc={3: "stopped"})
    assert kinds(diag.verdicts) == [("aborted", "")]
    verdict = diag.verdicts[0]
    assert verdict.summary == "aborted by operator root@head: stuck since noon"
    assert "root@head" in verdict.next_step and "stuck since noon" in verdict.next_step
    assert "also: rank 3 is stopped (SIGSTOP)" in verdict.evidence
    assert "ranks 0-2 adopted it in all_reduce seq 11 of comm 0:0-3" in verdict.evidence


def test_of_two_records_a_died_one_comes_before_a_link_one():
    died = revocation("died", 6, "process exited", comm=world(8), seen_by=7, time_ns=T0 + 5)
    link = revocation("link", 2, "connection reset", peer=6, comm=world(8), seen_by=2)
    job = Job(8).revoke([0, 1, 3, 4, 5, 7], died).revoke([2], link)
    diag = diagnose(job.snapshots(without=[6]))
    assert kinds(diag.verdicts) == [("dead", "6")]
    mentioned = [line for line in diag.verdicts[0].evidence if "a second failure" in line]
    assert mentioned == [
        "a second failure at the same time, adopted by rank 2: link between rank 2 and rank 6 "
        "broke (connection reset, seen by rank 2) (mentioned, not the verdict: a died record "
        "comes before a link one)"
    ]


def test_of_two_records_of_one_kind_and_call_the_older_time_ns_is_a_tie_break():
    first = revocation("died", 1, "SIGKILL", seen_by=0, time_ns=T0)
    second = revocation("died", 2, "SIGKILL", seen_by=3, time_ns=T0 + 1000)
    job = Job(4).revoke([3], second).revoke([0], first)
    diag = diagnose(job.snapshots(without=[1, 2]))
    assert kinds(diag.verdicts) == [("dead", "1")]
    assert "a tie-break only (clocks differ)" in " ".join(diag.verdicts[0].evidence)
    assert "also: ranks 1-2 left no dump" in diag.verdicts[0].evidence


def test_the_diagnosis_document_marks_the_origin():
    job, _ = killed_rank_6()
    doc = json.loads(json.dumps(diagnose(job.snapshots(without=[6])).to_dict()))
    assert [(v["kind"], v["suspects"], v["origin"]) for v in doc["verdicts"]] == [
        ("dead", "6", True)
    ]


def test_a_communicator_shrunk_away_from_the_dead_rank_is_shrunk_not_hung():
    """The survivors of rank 6's death shrank to ``1:0-5,7`` and run on there: the world
    communicator is shown as replaced, and the verdict says the survivors go on."""
    job, survivors = killed_rank_6()
    job.add_comm("1:0-5,7", survivors, done=4)
    diag = diagnose(job.snapshots(without=[6]))
    assert kinds(diag.verdicts) == [("dead", "6")]
    assert "comm 0:0-7 shrank to 1:0-5,7 without rank 6: the survivors run on (up to seq 4)" in (
        diag.verdicts[0].evidence
    )
    states = {c.comm: (c.state, c.shrunk_to) for c in diag.comms}
    assert states == {"0:0-7": ("shrunk", "1:0-5,7"), "1:0-5,7": ("idle", None)}


def test_a_later_subgroup_without_an_explained_rank_replaces_nothing():
    """A torch-style sub-group of live ranks is not a shrink: the world stays as it is."""
    job, _ = killed_rank_6()
    job.add_comm("1:0-3", [0, 1, 2, 3], done=4)
    diag = diagnose(job.snapshots(without=[6]))
    assert {c.comm: c.shrunk_to for c in diag.comms} == {"0:0-7": None, "1:0-3": None}


def skipped_after_shrink(job: Job, survivors: list[int]) -> Job:
    """The survivors of rank 6 run on ``1:0-5,7``, where rank 4 never enters seq 5 and the
    others wait on it."""
    job.add_comm("1:0-5,7", survivors, done=4)
    waiting = [r for r in survivors if r != 4]
    return job.enter(waiting, 5, comm="1:0-5,7", waiting_on=dict.fromkeys(waiting, 4))


def test_a_hang_after_a_shrink_comes_before_the_rank_the_shrink_left_out():
    """Rank 6 died and the survivors run on ``1:0-5,7`` (their documents no longer carry
    its record), where rank 4 never enters seq 5: that hang is the first verdict, and rank
    6 comes after it as shrunk away, with nothing left to restart."""
    survivors = [0, 1, 2, 3, 4, 5, 7]
    job = Job(8).enter(survivors, 11, state=FAILED, age_s=60, end_ns=-NS)
    diag = diagnose(skipped_after_shrink(job, survivors).snapshots(without=[6]))
    assert kinds(diag.verdicts) == [("not_entered", "4"), ("missing", "6")]
    hang, left = diag.verdicts
    assert (hang.comm, hang.seq, hang.shrunk_away) == ("1:0-5,7", 5, None)
    assert left.shrunk_away == "1:0-5,7"
    assert left.next_step == (
        "the survivors run on without rank 6 in comm 1:0-5,7 (nothing to restart); "
        "the log and exit status of rank 6 say why it left"
    )
    doc = diag.to_dict()
    assert [v["shrunk_away"] for v in doc["verdicts"]] == [None, "1:0-5,7"]


def test_the_record_a_shrink_got_past_stays_the_dead_ranks_verdict_after_a_present_hang():
    """The survivors keep rank 6's record after they shrank past it: it names rank 6 dead,
    as history, and the hang of the communicator they run on stays a verdict of its own."""
    job, survivors = killed_rank_6()
    diag = diagnose(skipped_after_shrink(job, survivors).snapshots(without=[6]))
    assert kinds(diag.verdicts) == [("not_entered", "4"), ("dead", "6")]
    hang, dead = diag.verdicts
    assert not hang.origin and not any("rank 6" in line for line in hang.evidence)
    assert dead.origin and dead.shrunk_away == "1:0-5,7"
    assert dead.summary == "rank 6 is dead: SIGKILL (seen by rank 3)"
    assert "ranks 0-5,7 adopted it in all_reduce seq 11 of comm 0:0-7" in dead.evidence


def _stopped_record_verdict(proc: dict[int, str] | None) -> Verdict:
    """Rank 3 was stopped when the watchdog expired the call; its record says so."""
    record = revocation("hang", 3, "is stopped (process state T)", seen_by=0, via="watchdog")
    job = Job(4).revoke(range(4), record)
    diag = diagnose(job.snapshots(), proc=proc)
    return next(v for v in diag.verdicts if v.ranks == "3")


def test_a_stopped_rank_of_a_post_mortem_gets_no_kill_cont_for_a_gone_pid():
    for proc in (None, {r: "gone" for r in range(4)}):
        step = _stopped_record_verdict(proc).next_step
        assert "kill -CONT" not in step, step
        assert step.startswith("its process is gone: find out who stopped rank 3 (pid 1003")


def test_a_stopped_rank_still_stopped_here_gets_kill_cont():
    proc = {0: "running", 1: "running", 2: "running", 3: "stopped"}
    assert _stopped_record_verdict(proc).next_step.startswith("kill -CONT 1003 on host-0")
