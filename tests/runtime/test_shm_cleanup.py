"""Shared memory leaves nothing behind: not after a clean exit, not after ``kill -9``."""

from __future__ import annotations

import os
import subprocess
import sys
import zlib
from typing import Any

import pytest
from bare_ranks import run_bare

from cclctl.runtime.transport.shm import segment as shm_segment
from scripts import script

WORKER = script("shm_worker.py")

TOKEN = "shm-test-token-0123456789abcdefghijkl"  # the job's, as a launcher makes one
pytestmark = pytest.mark.skipif(not shm_segment.available(), reason="no writable /dev/shm")


def job_files(job: str) -> list[str]:
    prefix = f"cclctl-{zlib.crc32(job.encode()):08x}-"
    return [p.name for p in shm_segment.SHM_DIR.iterdir() if p.name.startswith(prefix)]


def run_job(n: int, job: str, **env: str) -> list[dict[str, Any]]:
    """Bare rank processes around a store of our own: when one dies, nobody stops the rest."""
    return run_bare(WORKER, n, job, TOKEN, timeout_s=60, **env)


@pytest.mark.timeout(90)
def test_segments_are_unlinked_as_soon_as_every_rank_mapped_them() -> None:
    job = f"shm-clean-{os.getpid()}"
    lines = run_job(3, job, ITERS="20")
    joined = [line for line in lines if "transport" in line]
    assert [line["transport"] for line in joined] == ["shm"] * 3
    assert all(line["files"] == [] for line in joined)  # gone while the job still runs
    assert sum(1 for line in lines if line.get("done")) == 3
    assert job_files(job) == []


@pytest.mark.timeout(90)
def test_kill_9_leaks_nothing_and_the_survivors_fail_fast_naming_the_dead_rank() -> None:
    job = f"shm-kill-{os.getpid()}"
    lines = run_job(
        3,
        job,
        ITERS="1000000",
        CCLCTL_FAULT="kill:rank=1:seq=50",
        CCLCTL_TIMEOUT="30",
    )
    errors = [line for line in lines if "error" in line]
    assert sorted(line["rank"] for line in errors) == [0, 2]
    # fast: the dead rank fails them (the one who saw it: PeerError; the other: revoked by
    # it), not the 30 s timeout (CollectiveTimeout); both name rank 1 and its death
    assert {line["error"] for line in errors} <= {"PeerError", "CommRevoked"}
    assert "PeerError" in {line["error"] for line in errors}
    assert all("rank 1 (pid " in str(line["message"]) for line in errors)
    assert all(") died (" in str(line["message"]) for line in errors)
    assert job_files(job) == []


@pytest.mark.timeout(30)
def test_sweep_removes_segments_whose_owner_is_gone_and_keeps_live_ones() -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    ns = shm_segment.pid_namespace()
    stale = shm_segment.SHM_DIR / f"cclctl-0badc0de-r3-p{dead.pid}-n{ns}-00000000"
    live = shm_segment.SHM_DIR / f"cclctl-0badc0de-r4-p{os.getpid()}-n{ns}-00000000"
    elsewhere = shm_segment.SHM_DIR / f"cclctl-0badc0de-r5-p{dead.pid}-n{ns + 1}-00000000"
    stranger = shm_segment.SHM_DIR / f"not-cclctl-p{dead.pid}"
    for path in (stale, live, elsewhere, stranger):
        path.write_bytes(b"x")
    try:
        removed = shm_segment.sweep()
        assert stale.name in removed and not stale.exists()
        assert live.exists() and stranger.exists()
        assert elsewhere.exists()  # another pid namespace: its pid means nothing here
    finally:
        for path in (stale, live, elsewhere, stranger):
            path.unlink(missing_ok=True)


@pytest.mark.timeout(60)
def test_a_new_job_sweeps_what_a_crashed_setup_left() -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    ns = shm_segment.pid_namespace()
    stale = shm_segment.SHM_DIR / f"cclctl-0badc0de-r0-p{dead.pid}-n{ns}-11111111"
    stale.write_bytes(b"\0" * 4096)
    try:
        lines = run_job(2, f"shm-sweep-{os.getpid()}", ITERS="2")
        assert sum(1 for line in lines if line.get("done")) == 2
        assert not stale.exists()
    finally:
        stale.unlink(missing_ok=True)
