"""A job that rode through a link fault ends as one that recovered, not one that failed.

Three real ranks over TCP (``cclctl launch``), rank 1 closing its link to rank 2 as seq 3
starts, ``CCLCTL_RETRY_BUDGET`` on: every call ends exact after the retry. Each rank whose
call failed once dumps at exit with a reason that says a retry re-ran it (never "exit
after errors"), and ``cclctl diagnose hang`` reads the dumps as a healthy job. The pure
cases pin the count: an attempt no retry followed stays a failure.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cclctl.records import COMPLETED, FAILED, CollectiveRecord
from cclctl.telemetry.dumps import exit_reason
from cclctl.telemetry.recorder import Recorder
from scripts import script

JOB, RANKS, ITERS = "retryexit", 3, 5
RECOVERED = "exit after recovered errors (1 failed attempt re-run by a retry)"


def _run(tmp: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CCLCTL_")}
    env |= {
        "CCLCTL_JOB": JOB,
        "CCLCTL_TRACE_DIR": str(tmp),
        "CCLCTL_TRANSPORT": "tcp",
        "CCLCTL_RETRY_BUDGET": "20",
        "CCLCTL_FAULT": "link:rank=1:seq=3:peer=2",
        "COUNT": "65536",
        "ITERS": str(ITERS),
    }
    cmd = [sys.executable, "-m", "cclctl", "launch", "-n", str(RANKS), "--", sys.executable]
    return subprocess.run(
        [*cmd, script("retry_worker.py")], env=env, capture_output=True, text=True, timeout=100
    )


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_a_recovered_job_dumps_as_recovered_and_reads_as_healthy(tmp_path: Path) -> None:
    out = _run(tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    reasons = {}
    for rank in range(RANKS):
        doc = json.loads((tmp_path / f"cclctl-{JOB}-rank{rank}.json").read_text())
        counters = doc["counters"]
        # a rank whose call the fault failed dumps; one that saw no failed call finishes
        expected = RECOVERED if counters["errors"] else "finished"
        assert doc["reason"] == expected, (rank, doc["reason"], counters)
        reasons[rank] = doc["reason"]
    assert RECOVERED in reasons.values(), reasons  # the fault failed some call
    diag = subprocess.run(
        [sys.executable, "-m", "cclctl", "diagnose", "hang", str(tmp_path)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert diag.returncode == 0, diag.stdout + diag.stderr
    assert "HEALTHY" in diag.stdout, diag.stdout
    assert "was retried" in diag.stdout, diag.stdout


def _ended(rec: Recorder, seq: int, state: str, op: str = "all_reduce") -> None:
    record = CollectiveRecord(comm="0:0-1", seq=seq, op=op, state=state)
    record.end_ns = record.start_ns + 1
    rec.start(record)


def test_each_retry_recovers_one_failed_attempt() -> None:
    rec = Recorder(16, world_size=2)
    _ended(rec, 1, FAILED)
    rec.count_retry("0:0-1", "all_reduce")
    _ended(rec, 1, COMPLETED)
    assert (rec.failures(), rec.recovered()) == (1, 1)
    assert exit_reason(rec.failures(), rec.recovered()) == RECOVERED


def test_a_failure_no_retry_followed_stays_a_failure() -> None:
    rec = Recorder(16, world_size=2)
    _ended(rec, 1, FAILED)
    rec.count_retry("0:0-1", "all_reduce")
    _ended(rec, 1, FAILED)  # the re-run failed too: the budget ran out
    rec.count_hang("0:0-1", "all_reduce")
    assert (rec.failures(), rec.recovered()) == (3, 1)
    assert exit_reason(rec.failures(), rec.recovered()) == "exit after errors"


def test_a_retry_served_while_closing_recovers_the_communicators_failed_call() -> None:
    rec = Recorder(16, world_size=2)
    _ended(rec, 4, FAILED, op="broadcast")
    rec.count_retry("0:0-1", "close")  # the rank was closing when the retry came
    assert rec.recovered() == 1
    assert exit_reason(2, 2) == "exit after recovered errors (2 failed attempts re-run by a retry)"
