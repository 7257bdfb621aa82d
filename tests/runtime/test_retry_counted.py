"""Retries are counted: a link fault survived on one host leaves its mark everywhere.

Two real ranks over TCP (``cclctl launch``), rank 0 closing its link to rank 1 as seq 3
starts (``CCLCTL_FAULT=link:...``, which strikes a seq's first attempt only), with
``CCLCTL_RETRY_BUDGET`` on: every result is exact, each rank's dump counts the retry, its
records hold seq 3's two attempts (epochs 0 and 1), and ``cclctl diagnose hang`` reads the
dumps as healthy, naming the retried seq. Needs no root.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from retry_worker import rank_input

from scripts import script

pytestmark = [pytest.mark.slow, pytest.mark.timeout(90)]

COUNT, ITERS, JOB = 65536, 5, "retrycount"


def _run(tmp: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CCLCTL_")}
    env |= {
        "CCLCTL_JOB": JOB,
        "CCLCTL_TRACE_DIR": str(tmp),
        "CCLCTL_TRANSPORT": "tcp",
        "CCLCTL_RETRY_BUDGET": "20",
        "CCLCTL_FAULT": "link:rank=0:seq=3:peer=1",
        "COUNT": str(COUNT),
        "ITERS": str(ITERS),
    }
    cmd = [sys.executable, "-m", "cclctl", "launch", "-n", "2", "--", sys.executable]
    return subprocess.run(
        [*cmd, script("retry_worker.py")], env=env, capture_output=True, text=True, timeout=80
    )


def test_a_survived_link_fault_is_counted_recorded_and_read_as_healthy(tmp_path: Path) -> None:
    out = _run(tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    total = np.sum([rank_input(r, COUNT).astype(np.float64) for r in range(2)], axis=0)
    exact = hashlib.sha256(total.astype(np.float32).tobytes()).hexdigest()
    for rank in range(2):
        lines = [ln.split("] ", 1)[-1] for ln in out.stdout.splitlines() if f"[rank {rank}]" in ln]
        assert [ln.split()[2] for ln in lines if ln.startswith("digest ")] == [exact] * ITERS
        assert any(ln.startswith("rerun 2 3 2 ") for ln in lines), lines  # seq 3, attempt 2
        doc = json.loads((tmp_path / f"cclctl-{JOB}-rank{rank}.json").read_text())
        assert doc["counters"]["retries"] == 1, doc["counters"]
        at3 = [(r["epoch"], r["attempt"], r["state"]) for r in doc["records"] if r["seq"] == 3]
        assert [a[:2] for a in at3] == [(0, 1), (1, 2)], at3
        assert at3[0][2] != "completed" and at3[1][2] == "completed", at3
        assert {r["attempt"] for r in doc["records"] if r["seq"] != 3} == {1}
    diag = subprocess.run(
        [sys.executable, "-m", "cclctl", "diagnose", "hang", str(tmp_path)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert diag.returncode == 0, diag.stdout + diag.stderr
    assert "HEALTHY" in diag.stdout, diag.stdout
    assert "all_reduce seq 3 of comm 0:0-1 was retried: ranks 0-1 at attempt 2" in diag.stdout
