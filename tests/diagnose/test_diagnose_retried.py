"""A retried call (``CCLCTL_RETRY_BUDGET``) in the diagnosis: each rank's records hold one
attempt per run of the seq, each in its own epoch. The earlier, failed attempts are neither
a hang nor a mismatch; where a hang is in a retried seq, the verdict says which attempt
each rank reached."""

from __future__ import annotations

from diagnose_factory import T0, Job, ring_left

from cclctl.diagnose.engine import diagnose
from cclctl.records import COMPLETED, FAILED

LINK = "link between rank 1 and rank 2 broke (Connection reset by peer, seen by rank 1)"


def retried(job: Job, ranks: list[int], seq: int = 11, **second: object) -> Job:
    """``ranks`` ran ``seq`` once in epoch 0 (it failed on the link), then again in epoch 1."""
    job.enter(ranks, seq, state=FAILED, age_s=5.0, epoch=0, error=LINK)
    if second:
        job.enter(ranks, seq, epoch=1, attempt=2, **second)  # type: ignore[arg-type]
    return job


def test_a_survived_retry_is_healthy_and_says_so() -> None:
    job = retried(Job(4), [0, 1, 2, 3], state=COMPLETED, age_s=1.0)
    job.complete(range(4), 12)
    diag = diagnose(job.snapshots())
    assert not diag.fault, diag.to_dict()
    (verdict,) = diag.verdicts
    assert verdict.kind == "healthy"
    assert verdict.evidence[0] == "comm 0:0-3: every member seen completed seq 12"
    assert verdict.evidence[1] == (
        "all_reduce seq 11 of comm 0:0-3 was retried: ranks 0-3 at attempt 2 (epoch 1, completed)"
    )


def test_a_status_from_before_the_re_run_is_no_hang() -> None:
    """Rank 3's last status still shows its failed attempt (epoch 0); ranks 0-2 completed
    seq 11's second attempt, which rank 3 must have run with them: it is no suspect."""
    job = retried(Job(4), [0, 1, 2], state=COMPLETED, age_s=1.0)
    retried(job, [3])
    diag = diagnose(job.snapshots("status"), now_ns=T0)
    assert not diag.fault, [v.to_dict() for v in diag.verdicts]
    assert any(
        line.endswith("ranks 0-2 at attempt 2 (epoch 1, completed), rank 3 at attempt 1 "
                      "(epoch 0, failed)")
        for line in diag.verdicts[0].evidence
    ), diag.verdicts[0].evidence  # fmt: skip


def test_a_rank_that_never_entered_the_re_run_is_named_with_the_attempts() -> None:
    """Ranks 0, 1, 3 wait in attempt 2 of seq 11 (epoch 1) for 40 s; rank 2 stayed at its
    failed first attempt: it is the suspect, and the verdict shows who reached which."""
    job = retried(Job(4), [0, 1, 3], age_s=40.0, waiting_on=ring_left(4))
    retried(job, [2])
    diag = diagnose(job.snapshots(), now_ns=T0)
    first = diag.verdicts[0]
    assert diag.fault and 2 in [s.rank for s in first.suspects], [
        v.to_dict() for v in diag.verdicts
    ]
    assert "mismatch" not in {v.kind for v in diag.verdicts}
    assert (
        "all_reduce seq 11 of comm 0:0-3 was retried: ranks 0-1,3 at attempt 2 (epoch 1, "
        "in flight), rank 2 at attempt 1 (epoch 0, failed)"
    ) in first.evidence, first.evidence
