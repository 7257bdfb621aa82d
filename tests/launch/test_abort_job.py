"""`cclctl abort` against a real `cclctl launch` job of 4 ranks in all_reduce after all_reduce.

The operator runs it on the job's host without CCLCTL_TOKEN: the token comes from the job's
token file, as the launcher leaves it. Every rank's error must name the operator; with rank
2 SIGSTOPped (``CCLCTL_FAULT=stop``) the live ranks still raise, abort exits 3 naming rank 2,
and rank 2, once continued, raises at its next call.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from abort_job import AbortJob

from cclctl import auth
from cclctl.commands.operator_job import operator
from cclctl.config import job_dir
from cclctl.revocation import KEY
from cclctl.store.client import StoreClient

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


def _named(job: AbortJob, ranks: set[int], reason: str) -> None:
    """Each of ``ranks`` raised CollectiveAborted naming the operator and the reason."""
    assert job.wait_for("aborted", ranks, timeout_s=30), job.tail()
    for rank in ranks:
        error = job.aborted[rank][1]
        assert error.startswith("CollectiveAborted: "), error
        assert f"aborted by operator {operator()}: {reason}" in error, error


def test_every_rank_raises_naming_the_operator(tmp_path: Path) -> None:
    with AbortJob(tmp_path) as job:
        assert job.wait_for("ready", set(range(4))), job.tail()
        refused = job.abort("--job", job.job, env={"CCLCTL_TOKEN": "not-the-jobs-token"})
        assert refused.returncode == 2, refused.stdout + refused.stderr
        assert "abort needs the token of job" in refused.stderr and not job.aborted
        token = auth.read_token_file(job_dir(job.job))
        with StoreClient.from_address(job.store, token=token, timeout_s=10) as own:
            assert own.try_get(f"cclctl/{job.job}/{KEY}") is None  # nothing was written
        out = job.abort("--job", job.job, "--reason", "drill", "--json")
        assert out.returncode == 0, out.stdout + out.stderr + job.tail()
        doc = json.loads(out.stdout)
        assert doc["written"] and doc["complete"] and doc["silent"] == []
        assert [a["rank"] for a in doc["acknowledged"]] == [0, 1, 2, 3]
        assert {a["pid"] for a in doc["acknowledged"]} == {job.pid(r) for r in range(4)}
        _named(job, set(range(4)), "drill")


@pytest.mark.parametrize("transport", ["auto", "tcp"])
def test_a_stopped_peer_neither_blocks_the_others_nor_hides(tmp_path: Path, transport: str) -> None:
    env = {"CCLCTL_TRANSPORT": transport}
    with AbortJob(tmp_path, fault="stop:rank=2:seq=4", env=env) as job:
        assert job.wait_for("ready", set(range(4))), job.tail()
        assert job.wait_stopped(2), job.tail()
        out = job.abort("--reason", "stuck job", "--wait", "1")
        assert out.returncode == 3, out.stdout + out.stderr + job.tail()
        assert f"  rank 2 (pid {job.pid(2)} on " in out.stdout
        assert out.stdout.rstrip().endswith("stopped (SIGSTOP)"), out.stdout
        assert "acknowledged: 3 of 4 ranks" in out.stdout
        assert out.stderr.strip() == (
            f"cclctl: error: rank 2 of job {job.job!r} did not acknowledge the abort within 1s"
        )
        _named(job, {0, 1, 3}, "stuck job")
        job.close()  # continues rank 2: it meets the record at its next call
        _named(job, {2}, "stuck job")
