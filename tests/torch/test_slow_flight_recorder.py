"""``cclctl diagnose slow DIR`` on PyTorch Flight Recorder dumps alone (#35's post-mortem).

A real gloo job (fr_slow_job.py, 4 ranks through cclctl's launcher, not traced by cclctl)
whose rank 2 computes 30 ms more in each 50 ms step writes its Flight Recorder dumps at the
end; the diagnosis names rank 2 as the ``slow_rank``, the only suspect, and says its
source. The same job with no straggler is judged and named healthy. Windows of 1 s
(CCLCTL_SLOW_WINDOW) so a job of ~8 s holds enough complete ones.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

from torch_jobs import CCLCTL, child_env, run_job

pytestmark = pytest.mark.slow  # real gloo jobs

WORLD = 4
STEPS = 100
STEP_MS, EXTRA_MS = 50, 30
EXIT_FAULT, EXIT_OK = 3, 0


def _job(tmp_path: Path, slow_rank: int) -> Path:
    out = tmp_path / "fr"
    out.mkdir()
    env = child_env(TORCH_FR_BUFFER_SIZE="4000")
    args = [str(out), str(slow_rank), str(STEPS), str(STEP_MS), str(EXTRA_MS)]
    result, lines = run_job("fr_slow_job.py", WORLD, args, env=env, timeout_s=150)
    assert result.returncode == 0, lines.text()
    assert sorted(os.listdir(out)) == [f"nccl_trace_rank_{r}" for r in range(WORLD)]
    return out


def _diagnose(folder: Path, expect: int) -> dict[str, Any]:
    env = {**os.environ, "CCLCTL_SLOW_WINDOW": "1"}
    out = subprocess.run(
        [CCLCTL, "diagnose", "slow", str(folder), "--json"],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip
    assert out.returncode == expect, out.stdout + out.stderr
    doc: dict[str, Any] = json.loads(out.stdout)
    return doc


@pytest.mark.timeout(300)
def test_a_straggler_is_named_from_flight_recorder_dumps(tmp_path: Path) -> None:
    doc = _diagnose(_job(tmp_path, slow_rank=2), EXIT_FAULT)
    assert doc["status"] == "slow", doc
    assert [(f["kind"], f["ranks"]) for f in doc["findings"]] == [("slow_rank", [2])], doc
    assert doc["ranks_seen"] == WORLD
    assert "from Flight Recorder dumps: entry times only" in doc["reason"]
    assert any("no per-peer waits" in note for note in doc["notes"])
    # the straggler enters last and waits least in the newest judged window
    lags = {int(r): v["entry_lag_s"] for r, v in doc["ranks"].items()}
    shares = {int(r): v["wait_share"] for r, v in doc["ranks"].items()}
    assert max(lags, key=lambda r: lags[r]) == 2, doc["ranks"]
    assert min(shares, key=lambda r: shares[r]) == 2, doc["ranks"]


@pytest.mark.timeout(300)
def test_the_same_job_without_a_straggler_is_healthy(tmp_path: Path) -> None:
    doc = _diagnose(_job(tmp_path, slow_rank=-1), EXIT_OK)
    assert doc["status"] == "healthy", doc
    assert doc["findings"] == []
    assert doc["windows_judged"] >= 2
    assert doc["ranks_seen"] == WORLD
