"""Real jobs with injected faults: the live and the post-mortem diagnosis name the culprit.

Each case runs a job of bare rank processes (tests/fault_job.py), injects one fault with
``CCLCTL_FAULT`` at a chosen rank and seq, asks ``cclctl diagnose hang --store`` while the
job is hung, then terminates the job (ranks dump on SIGTERM) and asks
``cclctl diagnose hang DUMP_DIR``. Both must name exactly the injected rank (or link), the
kind of fault and the seq; a healthy job must get exit 0.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from fault_job import FaultJob

from cclctl.diagnose import mismatch
from cclctl.telemetry.dump_files import dump_filename

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]  # real fault-injection jobs


def _diagnose(*args: str) -> tuple[int, dict[str, Any], str]:
    out = subprocess.run(
        [sys.executable, "-m", "cclctl", "diagnose", "hang", *args, "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    try:
        doc = json.loads(out.stdout)
    except ValueError:
        doc = {}
    return out.returncode, doc, out.stderr


def _live(job: FaultJob, settle_s: float, want_kind: str) -> dict[str, Any]:
    """Ask the live job until the expected kind shows up first (the watchdog needs a moment),
    decided: a mismatch read while the ranks that failed first are tied and the others have
    not reported the call yet names every tied rank, and says so (mismatch.UNDECIDED)."""
    deadline = time.monotonic() + settle_s
    doc: dict[str, Any] = {}
    while time.monotonic() < deadline:
        code, doc, _ = _diagnose("--store", job.store, "--job", job.job)
        first = doc["verdicts"][0] if code == 3 else {}
        undecided = any(line.endswith(mismatch.UNDECIDED) for line in first.get("evidence", []))
        if first.get("kind") == want_kind and not undecided:
            return doc
        time.sleep(0.5)
    raise AssertionError(f"live diagnosis never said {want_kind}: {json.dumps(doc)[:2000]}")


def _watchdog_fired(job: FaultJob, culprit: int, timeout_s: float = 30) -> None:
    """A post-mortem is taken after the hang is established: wait for the dumps of every
    rank but the culprit (the watchdog's dump request reaches them once the job's record
    of the hang is agreed). A rank terminated before it learned of the hang would take the
    culprit's death at the SIGTERM for the job's failure."""
    deadline = time.monotonic() + timeout_s
    others = {dump_filename(job.job, r) for r in range(job.n) if r != culprit}
    while time.monotonic() < deadline and not others <= {p.name for p in job.dump_dir.iterdir()}:
        time.sleep(0.2)


def _first(doc: dict[str, Any]) -> dict[str, Any]:
    verdict: dict[str, Any] = doc["verdicts"][0]
    return verdict


# fault spec, op, world size, live kind, post-mortem kind, suspect ranks, seq
CASES = [
    ("skip:rank=2:seq=3", "all_reduce", 4, "not_entered", "not_entered", "2", 3),
    ("skip:rank=5:seq=2", "broadcast", 8, "not_entered", "not_entered", "5", 2),
    ("skip:rank=0:seq=4", "all_gather", 4, "not_entered", "not_entered", "0", 4),
    ("sleep:rank=1:seq=3:secs=30", "all_gather", 4, "not_entered", "not_entered", "1", 3),
    ("kill:rank=1:seq=3", "all_reduce", 4, "dead", "dead", "1", 3),  # dead by the revoke records
    ("kill:rank=6:seq=2", "all_gather", 8, "dead", "dead", "6", 2),
    ("stop:rank=3:seq=2", "all_reduce", 4, "stopped", "not_entered", "3", 2),
    ("stop:rank=4:seq=3", "all_gather", 8, "stopped", "not_entered", "4", 3),
    ("op:rank=1:seq=3:to=broadcast", "all_reduce", 4, "mismatch", "mismatch", "1", 3),
    ("count:rank=3:seq=2:to=7", "all_gather", 4, "mismatch", "mismatch", "3", 2),
    ("dtype:rank=2:seq=2:to=float64", "broadcast", 8, "mismatch", "mismatch", "2", 2),
]


@pytest.mark.parametrize(
    ("fault", "op", "n", "live_kind", "post_kind", "suspects", "seq"),
    CASES,
    ids=[f"{c[0].split(':')[0]}-{c[1]}-{c[2]}" for c in CASES],
)
def test_fault_is_named_live_and_post_mortem(
    tmp_path: Path,
    fault: str,
    op: str,
    n: int,
    live_kind: str,
    post_kind: str,
    suspects: str,
    seq: int,
) -> None:
    job = FaultJob(tmp_path, n, fault=fault, op=op)
    try:
        live = _first(_live(job, 30, live_kind))
        assert (live["suspects"], live["seq"]) == (suspects, seq), live
        assert [s["pid"] for s in live["suspect_ranks"]] == [job.pid(int(suspects))]
        if live_kind != "mismatch":  # a mismatch fails at once; nobody times out
            _watchdog_fired(job, int(suspects))
    finally:
        job.finish()
    code, doc, err = _diagnose(str(job.dump_dir))
    assert code == 3, err
    post = _first(doc)
    assert (post["kind"], post["suspects"], post["seq"]) == (post_kind, suspects, seq), post


def test_a_cut_link_is_named_as_the_link(tmp_path: Path) -> None:
    """Rank 1 closes its link to rank 0 (its partner in the first round)."""
    job = FaultJob(tmp_path, 4, fault="link:rank=1:seq=3:peer=0")
    try:
        live = _first(_live(job, 30, "link"))
        assert (live["link"], live["seq"]) == ([0, 1], 3), live
        _watchdog_fired(job, -1)
    finally:
        job.finish()
    code, doc, _ = _diagnose(str(job.dump_dir))
    post = _first(doc)
    assert (code, post["kind"], post["link"], post["seq"]) == (3, "link", [0, 1], 3), post


@pytest.mark.parametrize("n", [4, 8])
def test_a_healthy_job_is_healthy(tmp_path: Path, n: int) -> None:
    job = FaultJob(tmp_path, n, op="all_reduce", iters=20, pause_s=0.01)
    try:
        assert job.wait_all_exited(60) == [0] * n
        code, doc, err = _diagnose("--store", job.store, "--job", job.job)
        assert code == 0, (err, doc)
    finally:
        job.finish()
