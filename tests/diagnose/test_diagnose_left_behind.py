"""A rank left behind by ranks that finished: nothing hangs, but the job cannot end.

A broadcast lets its root and the branches not leading to a frozen leaf finish: they close
cleanly while the leaf never entered its next call. Judged by the documents' own times, so
ranks that end a moment apart are never flagged.
"""

from __future__ import annotations

from diagnose_factory import Job

from cclctl.diagnose.engine import diagnose
from cclctl.diagnose.model import Options


def left_behind(age_s: float) -> Job:
    """Ranks 0, 1 and 3 completed seq 8 and finished; rank 2 stopped after seq 4, and its
    document is ``age_s`` newer than theirs (0.2 s old, as the factory makes them)."""
    job = Job(4, done=4).complete([0, 1, 3], 8).finish([0, 1, 3])
    job.ranks[0].age_s = job.ranks[1].age_s = job.ranks[3].age_s = 0.2 + age_s
    return job


def test_a_rank_left_behind_by_finished_ranks_never_entered_its_next_call() -> None:
    diag = diagnose(left_behind(age_s=30).snapshots(), options=Options(stuck_after_s=5))
    verdict = diag.verdicts[0]
    assert (verdict.kind, verdict.ranks, verdict.seq) == ("not_entered", "2", 5)
    assert "ranks 0-1,3 finished (their last call: seq 8 of comm 0:0-3)" in verdict.evidence


def test_ranks_that_end_a_moment_apart_are_healthy() -> None:
    diag = diagnose(left_behind(age_s=1).snapshots(), options=Options(stuck_after_s=5))
    assert [v.kind for v in diag.verdicts] == ["healthy"]
