"""Evidence always survives, with no setup: real jobs without CCLCTL_TRACE_DIR dump into
their job's folder under TMPDIR (the test's), a clean job leaves finished documents, an
earlier run's files are gone, and ``cclctl diagnose hang`` with no argument reads it all."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from diagnose_factory import Job
from fault_job import FaultJob

from cclctl.config import job_dir
from cclctl.diagnose_io.dumpfile import read_dump
from cclctl.records import RankSnapshot

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]  # real jobs


def diagnose(tmp: Path, *args: str) -> tuple[int, dict[str, Any], str]:
    """``cclctl diagnose hang --json`` as a user runs it after the job: no CCLCTL_* set."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CCLCTL_")}
    out = subprocess.run(
        [sys.executable, "-m", "cclctl", "diagnose", "hang", *args, "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**env, "TMPDIR": str(tmp)},
    )
    try:
        doc = json.loads(out.stdout)
    except ValueError:
        doc = {}
    return out.returncode, doc, out.stderr


def documents(folder: Path, n: int) -> dict[int, RankSnapshot]:
    """Each rank's document in ``folder`` (those that exist and parse)."""
    found = {}
    for rank in range(n):
        path = folder / f"cclctl-faults-rank{rank}.json"
        if path.exists():
            found[rank] = read_dump(str(path))
    return found


def wait_until(cond: Callable[[], bool], timeout_s: float = 30) -> None:
    """Poll ``cond`` until it holds; fail (never hang) after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.2)


def test_a_hang_and_sigterm_leave_every_ranks_dump_in_the_jobs_folder(tmp_path: Path) -> None:
    job = FaultJob(tmp_path, 4, fault="sleep:rank=1:seq=3:secs=60", default_dumps=True)
    folder = job.dump_dir
    try:  # ranks 0, 2, 3 time out; rank 1 sleeps and dumps when the job asks it to
        wait_until(lambda: len(documents(folder, 4)) == 4)  # the watchdog's, the requested
        hung = documents(folder, 4)
        assert hung[1].reason.startswith("requested by rank ")
        for rank in (0, 2, 3):  # its own watchdog, or the first rank's request came first
            assert hung[rank].reason == "hang" or hung[rank].reason.startswith("requested by")
        assert os.stat(folder).st_mode & 0o777 == 0o700
        code, doc, err = diagnose(tmp_path)
        assert code == 3, err
        assert err.splitlines()[0] == f"cclctl: reading job 'faults' from {folder} (the only job)"
        verdict = doc["verdicts"][0]
        assert (verdict["kind"], verdict["suspects"], verdict["seq"]) == ("not_entered", "1", 3)
    finally:
        job.finish()  # SIGTERM: every rank dumps again on its way out
    stopped = documents(folder, 4)
    assert sorted(stopped) == [0, 1, 2, 3]
    assert {s.reason for s in stopped.values()} == {"terminated by SIGTERM"}
    assert [s.pid for _, s in sorted(stopped.items())] == [job.pid(r) for r in range(4)]


def test_a_clean_job_leaves_finished_documents(tmp_path: Path) -> None:
    job = FaultJob(tmp_path, 4, iters=5, pause_s=0.01, default_dumps=True)
    try:
        assert job.wait_all_exited(60) == [0] * 4
    finally:
        job.finish()
    docs = documents(job.dump_dir, 4)
    assert sorted(docs) == [0, 1, 2, 3]
    for rank, snap in docs.items():
        assert (snap.kind, snap.finished, snap.reason, snap.pid) == (
            "status",
            True,
            "finished",
            job.pid(rank),
        )
        assert snap.counters["collectives"] == 5 and snap.stacks == []
    code, doc, err = diagnose(tmp_path)
    assert code == 0, (err, doc)


def test_an_earlier_runs_files_do_not_speak_for_this_run(tmp_path: Path) -> None:
    """Job names repeat: an 8-rank run of 'faults' left its dumps; this 4-rank run's rank 1
    dies before it could dump. Its old dump must not stand in for it, nor ranks 4-7 join."""
    folder = Path(job_dir("faults", {"TMPDIR": str(tmp_path)}))
    folder.mkdir(mode=0o700, parents=True)
    for snap in Job(8, job="faults").snapshots():
        (folder / f"cclctl-faults-rank{snap.rank}.json").write_text(snap.to_json())
    job = FaultJob(tmp_path, 4, fault="kill:rank=1:seq=3", default_dumps=True)

    try:
        wait_until(lambda: job.procs[1].poll() is not None)  # killed at seq 3, no dump
    finally:
        job.finish()  # the survivors dump on SIGTERM
    left = sorted(os.listdir(folder))
    assert left == [f"cclctl-faults-rank{r}.json" for r in (0, 2, 3)]
    code, doc, err = diagnose(tmp_path)
    assert code == 3, err
    # dead where the survivors adopted its death before they were stopped, else missing;
    # never rank 1's old dump of the earlier run
    verdict = doc["verdicts"][0]
    assert (verdict["suspects"], verdict["seq"]) == ("1", 3), verdict
    assert verdict["kind"] in ("dead", "missing"), verdict
