"""`cclctl retry` of a `cclctl launch` job whose communicator cannot retry (one host: shared
memory only): every rank's call is aborted, its error naming the operator and why, and the
command exits 3 saying each rank was aborted instead of re-running."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from abort_job import AbortJob

from cclctl.commands.operator_job import operator

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


def test_a_shared_memory_job_is_aborted_naming_the_operator(tmp_path: Path) -> None:
    with AbortJob(tmp_path) as job:
        assert job.wait_for("ready", set(range(4))), job.tail()
        cmd = [sys.executable, "-m", "cclctl", "retry", "--store", job.store, "--job", job.job]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        assert job.wait_for("aborted", set(range(4)), timeout_s=30), job.tail()
        why = "retry asked, but its shm transport has no TCP links to renew"
        for rank in range(4):
            error = job.aborted[rank][1]
            assert error.startswith("CollectiveAborted: "), error
            assert f"aborted by operator {operator()}: {why}" in error, error
        assert out.returncode == 3, out.stdout + out.stderr + job.tail()
        assert out.stderr.strip() == (
            f"cclctl: error: ranks 0-3 of job {job.job!r} did not re-run the call within 5s"
        ), out.stderr
        assert "  rank 0: aborted, cannot retry: its shm transport" in out.stdout, out.stdout
