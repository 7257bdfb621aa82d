"""Real local jobs judged live by `diagnose slow`'s analysis: a compute straggler among 4
and 8 ranks (more compute per step, a CCLCTL_FAULT slow plan, or a cgroup CPU quota) is
the one suspect; a healthy
job under two busy loops is never a finding; the same straggler is found post-mortem from
the documents the ranks leave."""

from __future__ import annotations

import sys
import uuid
from pathlib import Path

import pytest
from live_job import live_job
from slow_job import WORKER, busy_loops, can_limit_cpu, cpu_quota, judged, poll, worker_env

from cclctl.diagnose.slow_model import SLOW_RANK, SlowReport
from cclctl.diagnose_io.slow_inputs import slow_from_inputs
from cclctl.diagnose_io.sources import load

pytestmark = pytest.mark.slow


def found(report: SlowReport) -> bool:
    return bool(report.findings)


def only_rank(report: SlowReport) -> list[tuple[str, list[int]]]:
    return [(f.kind, f.ranks) for f in report.findings]


#: Each step's compute: ranks waking from their compute on 2 loaded cores wait for a core
#: for milliseconds, and a rank a busy runqueue holds back for seconds is, for those
#: seconds, late as a straggler is; the injected 30% must stand well above that (30% of
#: the worker's default 20 ms step is only 6 ms).
STEP_S = "0.05"


@pytest.mark.timeout(180)
@pytest.mark.parametrize(("ranks", "slow"), [(4, 3), (4, 0), (8, 5)])
def test_a_rank_computing_30_percent_more_is_the_straggler(tmp_path: Path, ranks: int, slow: int):
    job = f"slow-{uuid.uuid4().hex[:6]}"
    env = worker_env(
        tmp_path, CCLCTL_JOB=job, SLOW_RANKS=str(slow), SLOW_EXTRA="0.3", STEP_S=STEP_S
    )
    with live_job([sys.executable, WORKER], ranks, env, tmp_path / "release") as run:
        seen = poll(run.store, job, found)
    report = seen[-1]
    assert only_rank(report) == [(SLOW_RANK, [slow])], report.to_dict()
    assert report.findings[0].slowdown > 1.15
    assert all(not r.findings or only_rank(r) == [(SLOW_RANK, [slow])] for r in seen)
    # post-mortem: the documents the ranks left at their clean exit say the same
    after = slow_from_inputs(load([str(tmp_path / "dumps")], job))
    assert [(f.kind, f.ranks) for f in after.findings] == [(SLOW_RANK, [slow])]


@pytest.mark.timeout(180)
@pytest.mark.parametrize("how", ["factor=0.3", "delay=0.01"])
def test_a_rank_slowed_by_plan_is_the_straggler(tmp_path: Path, how: str):
    """CCLCTL_FAULT's slow: late into every call from seq 10 on, by 0.3 of its step or 10 ms."""
    job = f"plan-{uuid.uuid4().hex[:6]}"
    env = worker_env(tmp_path, CCLCTL_JOB=job, CCLCTL_FAULT=f"slow:rank=1:seq=10:{how}")
    with live_job([sys.executable, WORKER], 4, env, tmp_path / "release") as run:
        seen = poll(run.store, job, found)
    assert only_rank(seen[-1]) == [(SLOW_RANK, [1])], seen[-1].to_dict()
    assert all(not r.findings or only_rank(r) == [(SLOW_RANK, [1])] for r in seen)


@pytest.mark.timeout(180)
@pytest.mark.skipif(not can_limit_cpu(), reason="needs the cgroup v1 cpu controller, writable")
def test_a_rank_under_a_cpu_quota_is_the_straggler(tmp_path: Path):
    job = f"quota-{uuid.uuid4().hex[:6]}"
    env = worker_env(tmp_path, CCLCTL_JOB=job, COMPUTE="busy", STEP_S="0.01")
    with live_job([sys.executable, WORKER], 4, env, tmp_path / "release") as run:
        pid = next(int(doc["pid"]) for doc in run.ready if doc["rank"] == 2)
        with cpu_quota(pid, 0.1):
            seen = poll(run.store, job, found)
    report = seen[-1]
    assert only_rank(report) == [(SLOW_RANK, [2])], report.to_dict()
    assert all(not r.findings or only_rank(r) == [(SLOW_RANK, [2])] for r in seen)


@pytest.mark.timeout(180)
def test_a_healthy_job_under_two_busy_loops_is_never_a_finding(tmp_path: Path):
    job = f"busy-{uuid.uuid4().hex[:6]}"
    env = worker_env(tmp_path, CCLCTL_JOB=job, COMPUTE="busy", STEP_S="0.01")
    with busy_loops(2), live_job([sys.executable, WORKER], 4, env, tmp_path / "release") as run:
        seen = poll(run.store, job, judged(10))
    assert [r.to_dict() for r in seen if r.findings] == []
    assert seen[-1].status == "healthy"
