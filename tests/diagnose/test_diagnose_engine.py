"""Golden verdicts of the pure engine, one scenario per kind of fault, built with factories."""

from __future__ import annotations

import pytest
from diagnose_factory import NS, T0, Job, ring_left

from cclctl.diagnose import mismatch
from cclctl.diagnose.engine import diagnose
from cclctl.diagnose.model import Options, Verdict
from cclctl.errors import BadInput, UsageError
from cclctl.records import ABORTED, FAILED, TIMED_OUT, snapshot_from_json


def kinds(verdicts: list[Verdict]) -> list[tuple[str, str]]:
    return [(v.kind, v.ranks) for v in verdicts]


# -- healthy ---------------------------------------------------------------------------------


def test_idle_job_is_healthy():
    diag = diagnose(Job(4).snapshots())
    assert not diag.fault
    assert diag.to_dict()["verdicts"] == [
        {
            "kind": "healthy",
            "summary": "no fault found in 4 ranks",
            "suspects": "",
            "suspect_ranks": [],
            "link": None,
            "comm": None,
            "seq": None,
            "op": None,
            "evidence": ["comm 0:0-3: every member seen completed seq 10"],
            "next_step": "nothing to do: no rank is missing, stopped, stale, behind or waiting",
            "where": [],
            "stacks": {},
            "origin": False,
            "shrunk_away": None,
        }
    ]


def test_ranks_briefly_apart_are_healthy():
    """A live job: some ranks just entered seq 11, one has not yet: that is not a hang."""
    job = Job(4).enter([0, 1, 2], age_s=0.5, waiting_on=ring_left(4))
    diag = diagnose(job.snapshots("status"), now_ns=T0)
    assert kinds(diag.verdicts) == [("healthy", "")]
    assert "running, not hung" in diag.verdicts[0].evidence[0]


# -- liveness ----------------------------------------------------------------------------------


def test_dead_rank_others_wait_on():
    job = Job(4).enter([0, 1, 2], waiting_on=ring_left(4)).enter([3], age_s=40)
    diag = diagnose(job.snapshots(), proc={3: "gone", 0: "running"})
    first = diag.verdicts[0].to_dict()
    assert first["kind"] == "dead"
    assert first["summary"] == "rank 3 is dead: the process is gone"
    assert first["suspect_ranks"] == [{"rank": 3, "host": "host-0", "pid": 1003}]
    assert (first["comm"], first["seq"], first["op"]) == ("0:0-3", 11, "all_reduce")
    assert first["evidence"] == [
        "rank 3 (pid 1003 on host-0): no such process",
        "rank 0 waits on rank 3 in all_reduce seq 11 of comm 0:0-3; ranks 1-2 wait on it "
        "through other ranks",
    ]
    assert "dmesg -T" in first["next_step"]
    assert kinds(diag.verdicts) == [("dead", "3")]  # the waits are its evidence, not a verdict


def test_a_dead_ranks_peers_whose_calls_failed_are_not_said_to_wait():
    """Revoked calls ended at once: they left the call with an error, they wait no more."""
    job = Job(4).enter([0, 1], waiting_on=ring_left(4)).enter([2], state=ABORTED, age_s=0.0)
    first = diagnose(job.snapshots(), proc={3: "gone"}).verdicts[0]
    assert (first.kind, first.ranks) == ("dead", "3")
    assert (
        "ranks 0-1 wait in all_reduce seq 11 of comm 0:0-3 (the longest for 30.0s); "
        "rank 2 left it with an error (aborted)"
    ) in first.evidence
    job = Job(4).enter([0, 1, 2], state=ABORTED, age_s=0.0)
    first = diagnose(job.snapshots(), proc={3: "gone"}).verdicts[0]
    assert "ranks 0-2 left all_reduce seq 11 of comm 0:0-3 with an error (aborted)" in (
        first.evidence
    )
    assert not [line for line in first.evidence if " wait in " in line]


def test_sigstopped_rank_is_stopped_and_names_kill_cont():
    job = Job(4).enter([0, 1, 2, 3], waiting_on=ring_left(4))
    diag = diagnose(job.snapshots(), proc={2: "stopped"})
    assert kinds(diag.verdicts) == [("stopped", "2")]
    verdict = diag.verdicts[0]
    assert verdict.next_step.startswith("kill -CONT 1002 on host-0")
    assert "rank 3 waits on rank 2 in all_reduce seq 11 of comm 0:0-3" in verdict.evidence[1]


@pytest.mark.parametrize("read_back", [False, True], ids=["objects", "json"])
def test_a_rank_stopped_inside_the_call_the_others_wait_in_is_placed_there(
    read_back: bool,
) -> None:
    """Nobody says whom they wait on (a gloo job); the stopped rank's status shows it inside
    seq 11, which a status holds twice (in its records and as the call in flight): read back
    from JSON the two are copies, and they are still one call, in flight."""
    job = Job(4).enter([0, 1, 3], age_s=3.0).enter([2], age_s=5.0).stale([2], 4.0)
    statuses = job.snapshots("status")
    if read_back:
        statuses = [snapshot_from_json(s.to_json()) for s in statuses]
    first = diagnose(statuses, now_ns=T0, proc={2: "stopped"}).verdicts[0]
    assert (first.kind, first.ranks, first.seq, first.op) == ("stopped", "2", 11, "all_reduce")
    assert "rank 2 stopped inside all_reduce seq 11 of comm 0:0-3" in first.evidence


@pytest.mark.parametrize("read_back", [False, True], ids=["objects", "json"])
def test_a_rank_stopped_inside_a_call_the_others_completed_is_placed_where_they_wait(
    read_back: bool,
) -> None:
    """A DDP job: rank 1's last status shows it inside all_reduce seq 7 (its call ended in
    torch's work thread after it published), then it stopped; the others completed seq 7
    and wait in seq 8 on nobody in particular (gloo does not say). The verdict is seq 8,
    from live statuses as read from the store (JSON) as from the records themselves."""
    job = Job(4, done=6).complete([0, 2, 3], 7).enter([1], 7, age_s=5.0).stale([1], 4.0)
    job.enter([0, 2, 3], 8, age_s=3.5, state=TIMED_OUT)
    statuses = job.snapshots("status")
    if read_back:
        statuses = [snapshot_from_json(s.to_json()) for s in statuses]
    diag = diagnose(statuses, now_ns=T0, proc={1: "stopped"})
    assert kinds(diag.verdicts) == [("stopped", "1")]
    first = diag.verdicts[0]
    assert (first.comm, first.seq, first.op) == ("0:0-3", 8, "all_reduce")
    assert first.evidence[1:] == [
        "rank 1 was inside all_reduce seq 7 of comm 0:0-3 when it last reported; the others "
        "completed it",
        "rank 1 had not entered all_reduce seq 8 of comm 0:0-3 when it last reported",
        "ranks 0,2-3 wait in all_reduce seq 8 of comm 0:0-3 (the longest for 3.5s)",
    ]


def test_stale_heartbeat_live():
    job = Job(8).enter(range(8), waiting_on=ring_left(8)).stale([5], age_s=60)
    statuses = job.snapshots("status")
    unknown = diagnose(statuses, now_ns=T0)
    assert kinds(unknown.verdicts) == [("stale", "5")]
    assert unknown.verdicts[0].summary == "status stale for rank 5: no status for too long"
    assert "ps -o stat= -p 1005" in unknown.verdicts[0].next_step
    running = diagnose(statuses, now_ns=T0, proc={5: "running"})
    assert kinds(running.verdicts) == [("stale", "5")]  # never "stopped" while it runs
    assert running.verdicts[0].summary.startswith("status stale for rank 5: the process runs")
    assert running.verdicts[0].next_step.startswith("`py-spy dump --pid 1005` on host-1")
    dead = diagnose(statuses, now_ns=T0, proc={5: "zombie"})
    assert kinds(dead.verdicts) == [("dead", "5")]
    assert "zombie" in dead.verdicts[0].evidence[0]


def test_missing_rank_others_wait_on_comes_first():
    job = Job(8).enter(range(7), waiting_on=ring_left(8))
    diag = diagnose(job.snapshots(without=[7, 3]), world_size=8)
    # rank 7 is waited on (corroborated); rank 3 is only missing, and rank 4 waits on it
    assert kinds(diag.verdicts) == [("missing", "3,7")]
    assert diag.verdicts[0].corroborated
    assert diag.verdicts[0].summary == "ranks 3,7 left no dump"


def test_partial_dumps_of_a_healthy_job_still_name_the_missing_ranks():
    diag = diagnose(Job(8).snapshots(without=range(4, 8)))
    assert kinds(diag.verdicts) == [("missing", "4-7")]
    assert diag.verdicts[0].evidence == ["no dump from ranks 4-7 among the 4 read"]


def test_unreadable_statuses_count_as_missing():
    job = Job(4)
    diag = diagnose(job.snapshots("status", without=[2]), now_ns=T0, unreadable={2: "bad JSON"})
    assert kinds(diag.verdicts) == [("missing", "2")]
    assert diag.verdicts[0].evidence == ["rank 2 sent a status that cannot be read: bad JSON"]


# -- frontier ----------------------------------------------------------------------------------


def test_rank_that_never_entered_golden():
    job = Job(4).enter([0, 1, 2], waiting_on=ring_left(4))
    job.stack(
        3,
        ("/job/train.py", 60, "main", "batch = load_batch(step)"),
        ("/job/train.py", 41, "load_batch", "time.sleep(3600)"),
    )
    diag = diagnose(job.snapshots())
    assert diag.to_dict()["verdicts"] == [
        {
            "kind": "not_entered",
            "summary": "rank 3 never entered all_reduce seq 11 of comm 0:0-3",
            "suspects": "3",
            "suspect_ranks": [{"rank": 3, "host": "host-0", "pid": 1003}],
            "link": None,
            "comm": "0:0-3",
            "seq": 11,
            "op": "all_reduce",
            "evidence": [
                "ranks 0-2 wait in all_reduce seq 11 of comm 0:0-3 (the longest for 30.0s)",
                "rank 3 last called all_reduce seq 10 on this communicator and completed it",
                "rank 3 has nothing in flight: it is outside any collective (computing, in I/O, "
                "or stuck)",
                "rank 0 waits on rank 3 in all_reduce seq 11 of comm 0:0-3; ranks 1-2 wait on "
                "it through other ranks",
            ],
            "next_step": "the stack in rank 3's dump (the stack line above; `--stacks` prints "
            "every thread) shows where it is instead of all_reduce seq 11 of comm 0:0-3",
            "where": ["rank 3 is in train.py:41 load_batch -> time.sleep"],
            "stacks": {
                "3": [
                    {
                        "name": "MainThread",
                        "ident": 4,
                        "main": True,
                        "omitted": 0,
                        "call": "",
                        "frames": [
                            {
                                "file": "/job/train.py",
                                "line": 60,
                                "func": "main",
                                "code": "batch = load_batch(step)",
                            },
                            {
                                "file": "/job/train.py",
                                "line": 41,
                                "func": "load_batch",
                                "code": "time.sleep(3600)",
                            },
                        ],
                    }
                ]
            },
            "origin": False,
            "shrunk_away": None,
        }
    ]


def test_not_entered_names_what_the_rank_does_instead():
    job = Job(4).add_comm("1:0-3", range(4), done=11)
    job.enter([0, 1, 2], waiting_on=ring_left(4))
    job.enter([3], comm="1:0-3", op="broadcast", root=0, waiting_on={3: 0})
    diag = diagnose(job.snapshots())
    assert kinds(diag.verdicts) == [("not_entered", "3"), ("not_entered", "0-2")]
    world = diag.verdicts[0]
    assert world.comm == "0:0-3"
    assert (
        "rank 3 is in broadcast seq 12 of comm 1:0-3 (for 30.0s, waiting to recv from rank 0) "
        "instead" in world.evidence
    )
    assert world.next_step.startswith("the ranks call collectives in a different order")


def test_leaders_are_never_culprits():
    """Rank 0 (a broadcast root) went on to seq 12; ranks 1-2 wait in 11; rank 3 never came."""
    job = Job(4).complete([0], 11).enter([0], waiting_on={0: 1})
    job.enter([1, 2], waiting_on={1: 3, 2: 3})
    diag = diagnose(job.snapshots())
    assert kinds(diag.verdicts) == [("not_entered", "3")]
    assert diag.verdicts[0].seq == 11
    assert all(0 not in (s.rank for s in v.suspects) for v in diag.verdicts)


def test_sub_group_hung_while_world_is_idle():
    job = Job(8).add_comm("1:0-1", [0, 1], done=6)
    job.enter([0], comm="1:0-1", waiting_on={0: 1})
    diag = diagnose(job.snapshots())
    assert kinds(diag.verdicts) == [("not_entered", "1")]
    verdict = diag.verdicts[0]
    assert (verdict.comm, verdict.seq) == ("1:0-1", 7)
    summaries = {c.comm: c.state for c in diag.comms}
    assert summaries == {"0:0-7": "idle", "1:0-1": "hung"}


def test_stragglers_at_two_positions_get_one_verdict_each():
    job = (
        Job(8).complete([0, 1, 2, 3, 4, 5], 12).enter(range(6), waiting_on={r: 6 for r in range(6)})
    )
    job.complete([6], 11)  # rank 6 finished 11 but never entered 13; rank 7 is at 10
    diag = diagnose(job.snapshots())
    assert kinds(diag.verdicts) == [("not_entered", "7"), ("not_entered", "6")]
    assert [v.seq for v in diag.verdicts] == [11, 12]


# -- mismatch ----------------------------------------------------------------------------------


def test_mismatched_op_golden():
    job = Job(4).enter([0, 1, 3], waiting_on=ring_left(4))
    job.enter([2], op="broadcast", root=0, waiting_on={2: 0})
    diag = diagnose(job.snapshots())
    assert kinds(diag.verdicts) == [("mismatch", "2")]
    assert diag.verdicts[0].to_dict() | {"next_step": ""} == {
        "kind": "mismatch",
        "summary": "rank 2 called broadcast(float32 x 1024, root 0) where ranks 0-1,3 called "
        "all_reduce(float32 x 1024) at seq 11 of comm 0:0-3",
        "suspects": "2",
        "suspect_ranks": [{"rank": 2, "host": "host-0", "pid": 1002}],
        "link": None,
        "comm": "0:0-3",
        "seq": 11,
        "op": "all_reduce",
        "evidence": [
            "ranks 0-1,3 called all_reduce(float32 x 1024)",
            "rank 2 called broadcast(float32 x 1024, root 0)",
            "rank 3 waits on rank 2 in all_reduce seq 11 of comm 0:0-3; ranks 0-1 wait on it "
            "through other ranks",
        ],
        "next_step": "",
        "where": [],
        "stacks": {},
        "origin": False,
        "shrunk_away": None,
    }


def test_mismatch_tie_takes_the_group_with_the_lowest_rank_as_reference():
    job = Job(4).enter([0, 2], count=1024).enter([1, 3], count=2048)
    diag = diagnose(job.snapshots())
    assert kinds(diag.verdicts)[0] == ("mismatch", "1,3")
    assert (
        "the largest groups are the same size; the one with rank 0 is taken as the reference"
        in diag.verdicts[0].evidence
    )


def test_a_tie_while_members_have_not_reported_the_seq_names_every_tied_rank():
    """A live read just after ranks 2 and 5 failed: the other six still show seq 10 done,
    nothing of seq 11. Which of the two called the odd thing is not known yet: both are
    suspects; once a third rank shows its call, the majority decides."""
    job = Job(8).enter([2], dtype="float64", age_s=0.5).enter([5], age_s=0.5)
    diag = diagnose(job.snapshots())
    assert kinds(diag.verdicts)[0] == ("mismatch", "2,5")
    assert any(line.endswith(mismatch.UNDECIDED) for line in diag.verdicts[0].evidence)
    assert "no call of ranks 0-1,3-4,6-7 at seq 11 is known yet" in diag.verdicts[0].evidence[-1]
    later = Job(8).enter([2], dtype="float64", age_s=0.5).enter([5, 7], age_s=0.5)
    decided = diagnose(later.snapshots())
    assert kinds(decided.verdicts)[0] == ("mismatch", "2")
    assert not any(mismatch.UNDECIDED in line for line in decided.verdicts[0].evidence)


def test_mismatch_ignores_fields_a_foreign_trace_leaves_empty():
    job = Job(4).enter([0, 1], dtype="", count=0).enter([2, 3])
    diag = diagnose(job.snapshots())
    assert "mismatch" not in [v.kind for v in diag.verdicts]


def test_all_to_allv_counts_differ_by_rank_and_are_not_a_mismatch():
    job = Job(4).enter([0, 2], op="all_to_allv", count=1024)
    job.enter([1, 3], op="all_to_allv", count=2048)
    assert "mismatch" not in [v.kind for v in diagnose(job.snapshots()).verdicts]
    odd = Job(4).enter([0, 1, 3], op="all_to_allv", count=1024)
    odd.enter([2], op="all_to_all", count=1024)
    assert kinds(diagnose(odd.snapshots()).verdicts)[0] == ("mismatch", "2")


# -- waits -------------------------------------------------------------------------------------


def test_two_ranks_waiting_on_each_other_is_a_link():
    waits = {0: 1, 1: 2, 2: 5, 5: 2, 3: 2, 4: 3, 6: 5, 7: 6}
    job = Job(8).enter(range(8), waiting_on=waits)
    diag = diagnose(job.snapshots())
    assert kinds(diag.verdicts) == [("link", "2,5")]
    verdict = diag.verdicts[0]
    assert verdict.link == (2, 5)
    assert verdict.summary.startswith("link 2<->5 is broken or stalled")
    assert verdict.next_step.startswith("check the link between host-0 and host-1 (ranks 2 and 5)")


def test_chain_ending_at_a_rank_that_waits_on_nobody():
    job = Job(4).enter([0, 1, 3], waiting_on={0: 1, 1: 2, 3: 2}).enter([2], step=3, steps=6)
    verdict = diagnose(job.snapshots()).verdicts[0]
    assert (verdict.kind, verdict.ranks) == ("stuck", "2")
    assert verdict.summary == "rank 2 is inside all_reduce seq 11 of comm 0:0-3 but waits on nobody"
    assert "rank 2 has been in it 30.0s, step 3/6" in verdict.evidence


def test_waits_on_a_rank_that_already_left_name_the_link():
    job = Job(4).complete([3], 11).enter([0, 1, 2], waiting_on={0: 3, 1: 0, 2: 1})
    verdict = diagnose(job.snapshots()).verdicts[0]
    assert (verdict.kind, verdict.ranks, verdict.link) == ("link", "0,3", (0, 3))
    assert verdict.summary.endswith("but rank 3 already finished it")


def test_ring_cycle_broken_where_a_rank_waits_to_send():
    job = Job(4).enter([0, 1, 3], waiting_on=ring_left(4))
    job.enter([2], waiting_on={2: 3}, waiting_for="send")
    verdict = diagnose(job.snapshots()).verdicts[0]
    assert (verdict.kind, verdict.link) == ("link", (2, 3))


def test_ring_cycle_broken_where_the_step_is_lowest():
    job = (
        Job(4)
        .enter([0, 1, 3], waiting_on=ring_left(4), step=5)
        .enter([2], waiting_on={2: 1}, step=2)
    )
    verdict = diagnose(job.snapshots()).verdicts[0]
    assert (verdict.kind, verdict.link) == ("link", (1, 2))
    assert (
        "rank 2 is at step 2, behind the others: data from rank 1 stopped there" in verdict.evidence
    )


def test_uniform_ring_cycle_names_nobody():
    job = Job(4).enter(range(4), waiting_on=ring_left(4))
    verdict = diagnose(job.snapshots()).verdicts[0]
    assert (verdict.kind, verdict.suspects, verdict.link) == ("stuck", [], None)
    assert (
        verdict.summary
        == "ranks 0-3 wait on each other in a cycle in all_reduce seq 11 of comm 0:0-3"
    )


def test_hang_without_any_waits_is_still_a_fault():
    diag = diagnose(Job(4).enter(range(4)).snapshots())
    assert kinds(diag.verdicts) == [("stuck", "")]
    assert (
        diag.verdicts[0].summary
        == "all_reduce seq 11 of comm 0:0-3 is hung and no rank says whom it waits on"
    )


def test_timed_out_records_without_waits_use_the_error_message():
    """After the timeout the runtime clears waiting_on; its error still names the peer."""
    job = Job(4)
    for rank in range(3):
        left = (rank - 1) % 4
        error = (
            f"rank {rank}: all_reduce seq 11 timed out after 60.0s waiting to recv from rank {left}"
        )
        job.enter([rank], state=TIMED_OUT, age_s=1, end_ns=1, error=error)
    job.enter(
        [3],
        state=FAILED,
        end_ns=1,
        error="rank 3: link to rank 2 broke while receiving it in all_reduce seq 11: reset",
    )
    diag = diagnose(job.snapshots())
    assert kinds(diag.verdicts) == [("link", "2-3")]
    assert diag.verdicts[0].link == (2, 3)


def test_sub_group_waits_given_as_indexes_into_its_members():
    job = Job(4).add_comm("1:2-3", [2, 3], done=4)
    job.enter([2, 3], comm="1:2-3", waiting_on={2: 1, 3: 0})  # local 1 is rank 3, 0 is rank 2
    verdict = diagnose(job.snapshots()).verdicts[0]
    assert (verdict.kind, verdict.link, verdict.comm) == ("link", (2, 3), "1:2-3")


# -- input handling and determinism --------------------------------------------------------------


def test_newest_duplicate_wins_and_is_noted():
    old = Job(4).snapshot(3)
    new = Job(4).enter([0, 1, 2, 3], age_s=0.1).snapshot(3)
    new.time_ns += NS
    rest = Job(4).enter([0, 1, 2], age_s=0.1).snapshots(without=[3])
    diag = diagnose([*rest, new, old])
    assert not diag.fault
    assert diag.notes == [
        f"rank 3: 2 documents for this rank; kept the newest (time_ns {new.time_ns})"
    ]


def test_mixed_jobs_are_refused():
    with pytest.raises(BadInput, match=r"the documents come from 2 jobs \(a, b\)"):
        diagnose([Job(2, job="a").snapshot(0), Job(2, job="b").snapshot(1)])


def test_nothing_to_diagnose():
    with pytest.raises(BadInput, match="nothing to diagnose"):
        diagnose([])


def test_world_size_smaller_than_a_rank_seen_is_a_usage_error():
    with pytest.raises(UsageError, match="world size 2 is too small: rank 3 was seen"):
        diagnose(Job(4).snapshots(), world_size=2)


def test_bad_process_state_is_a_usage_error():
    with pytest.raises(UsageError, match="process state of rank 1 is 'asleep'"):
        diagnose(Job(2).snapshots(), proc={1: "asleep"})


def test_thresholds_are_options():
    job = Job(4).enter([0, 1, 2], age_s=3, waiting_on=ring_left(4))
    assert not diagnose(job.snapshots()).fault
    assert diagnose(job.snapshots(), options=Options(stuck_after_s=2)).fault
