"""`cclctl diagnose hang` with no path: the newest job's dumps in ${TMPDIR:-/tmp}/cclctl-<uid>/,
another with --job, CCLCTL_TRACE_DIR when set, and a one-line error when there is none."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from diagnose_factory import Job, ring_left

EXIT_OK, EXIT_USAGE, EXIT_FAULT = 0, 2, 3


def hang(tmp: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("CCLCTL_")}
    cmd = [sys.executable, "-m", "cclctl", "diagnose", "hang", *args]
    return subprocess.run(
        cmd, capture_output=True, text=True, timeout=60, env={**base, "TMPDIR": str(tmp), **env}
    )


def jobs_dir(tmp: Path) -> Path:
    return tmp / f"cclctl-{os.getuid()}"


def write_job(folder: Path, job: Job, mtime: float) -> Path:
    """``job``'s dumps in ``folder`` (made 0700, beside a token file), all dated ``mtime``."""
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    token = folder / "token"
    token.write_text("aaaabbbbccccddddeeeeffffgggghhhhiiiijjjjkkk\n")
    token.chmod(0o600)
    for snap in job.snapshots():
        path = folder / f"cclctl-{snap.job}-rank{snap.rank}.json"
        path.write_text(snap.to_json())
        os.utime(path, (mtime, mtime))
    return folder


def hung(name: str) -> Job:
    return Job(4, job=name).enter([0, 1, 2], waiting_on=ring_left(4))


@pytest.mark.timeout(60)
def test_no_argument_reads_the_newest_job_and_says_which(tmp_path: Path) -> None:
    base = jobs_dir(tmp_path)
    write_job(base / "train", hung("train"), mtime=1_000_000)
    newest = write_job(base / "bench", Job(4, job="bench"), mtime=2_000_000)
    only_token = base / "default"  # a job's folder with its token and no dump yet, newer still
    only_token.mkdir(mode=0o700)
    (only_token / "token").write_text("x\n")

    out = hang(tmp_path)
    assert out.returncode == EXIT_OK, out.stderr
    assert out.stderr == (
        f"cclctl: reading job 'bench' from {newest} (the newest of 2 jobs; --job picks another)\n"
    )
    assert out.stdout.splitlines()[0].startswith("job bench · dumps of 4/4 ranks")


@pytest.mark.timeout(60)
def test_job_picks_another_job_in_the_folder(tmp_path: Path) -> None:
    base = jobs_dir(tmp_path)
    older = write_job(base / "train", hung("train"), mtime=1_000_000)
    write_job(base / "bench", Job(4, job="bench"), mtime=2_000_000)

    out = hang(tmp_path, "--job", "train")
    assert out.returncode == EXIT_FAULT
    assert out.stderr.splitlines() == [
        f"cclctl: reading job 'train' from {older}",
        "cclctl: error: fault found: rank 3 never entered all_reduce seq 11 of comm 0:0-3",
    ]


@pytest.mark.timeout(60)
def test_a_lone_job_is_the_only_job(tmp_path: Path) -> None:
    folder = write_job(jobs_dir(tmp_path) / "train", hung("train"), mtime=1_000_000)
    out = hang(tmp_path)
    assert out.returncode == EXIT_FAULT
    assert out.stderr.splitlines()[0] == f"cclctl: reading job 'train' from {folder} (the only job)"


@pytest.mark.timeout(60)
def test_the_trace_dir_is_read_when_set(tmp_path: Path) -> None:
    write_job(jobs_dir(tmp_path) / "bench", Job(4, job="bench"), mtime=2_000_000)
    traces = write_job(tmp_path / "traces", hung("train"), mtime=1_000_000)
    out = hang(tmp_path, CCLCTL_TRACE_DIR=str(traces))
    assert out.returncode == EXIT_FAULT
    assert out.stderr.splitlines()[0] == f"cclctl: reading the dumps in {traces} (CCLCTL_TRACE_DIR)"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("made", [False, True])
def test_no_job_at_all_is_one_line_and_exit_2(tmp_path: Path, made: bool) -> None:
    base = jobs_dir(tmp_path)
    if made:  # a folder with a token only: a job that left no dump
        (base / "default").mkdir(mode=0o700, parents=True)
        (base / "default" / "token").write_text("x\n")
    out = hang(tmp_path)
    assert out.returncode == EXIT_USAGE
    assert out.stderr == (
        f"cclctl: error: no job's dumps in {base}: give dump files or folders, or --store "
        "HOST:PORT (or CCLCTL_STORE) for a live job\n"
    )


@pytest.mark.timeout(60)
def test_an_unknown_job_is_one_line_and_exit_2(tmp_path: Path) -> None:
    write_job(jobs_dir(tmp_path) / "bench", Job(4, job="bench"), mtime=2_000_000)
    out = hang(tmp_path, "--job", "nope")
    assert out.returncode == EXIT_USAGE
    assert out.stderr == (
        f"cclctl: error: no dumps of job 'nope' in {jobs_dir(tmp_path) / 'nope'}\n"
    )


@pytest.mark.timeout(60)
def test_a_path_given_still_wins(tmp_path: Path) -> None:
    write_job(jobs_dir(tmp_path) / "bench", Job(4, job="bench"), mtime=2_000_000)
    elsewhere = write_job(tmp_path / "elsewhere", hung("train"), mtime=1_000_000)
    out = hang(tmp_path, str(elsewhere))
    assert out.returncode == EXIT_FAULT
    assert not out.stderr.startswith("cclctl: reading")


@pytest.mark.timeout(60)
@pytest.mark.skipif(os.geteuid() != 0, reason="making a folder another user's needs root")
def test_a_folder_of_another_user_is_passed_over(tmp_path: Path) -> None:
    base = jobs_dir(tmp_path)
    mine = write_job(base / "train", hung("train"), mtime=1_000_000)
    planted = write_job(base / "planted", Job(4, job="planted"), mtime=2_000_000)
    os.chown(planted, 54321, 54321)
    out = hang(tmp_path)
    assert out.returncode == EXIT_FAULT
    assert out.stderr.splitlines()[0] == f"cclctl: reading job 'train' from {mine} (the only job)"
