"""`cclctl bench --backend gloo`: the same sweep, table and checks through torch.distributed,
and the device twins that keep NCCL's buffers on the GPU (exercised here with CPU twins).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

from torch_jobs import child_env, run_job

pytestmark = pytest.mark.slow  # cclctl bench on real gloo ranks

CCLCTL = str(Path(sys.executable).with_name("cclctl"))
OPS = "all_reduce,all_gather,reduce_scatter,broadcast,reduce,alltoall,sendrecv"


@pytest.mark.timeout(120)
def test_the_sweep_runs_and_checks_every_op_on_gloo() -> None:
    args = ["bench", "--backend", "gloo", "-g", "2", "-b", "8", "-e", "4K", "-f", "8",
            "-n", "3", "-w", "1", "--collective", OPS, "-J", "-"]  # fmt: skip
    out = subprocess.run(
        [CCLCTL, *args], capture_output=True, text=True, timeout=100,
        env=dict(os.environ, **child_env()),
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["meta"]["backend"] == "gloo"
    assert doc["ok"] is True
    rows = doc["rows"]
    assert sorted({r["op"] for r in rows}) == sorted(OPS.split(","))
    assert all(r["out_of_place"]["#wrong"] == 0 for r in rows)
    assert all(r["in_place"]["#wrong"] in (0, None) for r in rows)  # in-place sendrecv: unchecked
    assert all(r["out_of_place"]["time"] > 0 for r in rows)


@pytest.mark.timeout(120)
def test_device_twins_are_uploaded_after_resets_and_downloaded_for_the_check() -> None:
    result, lines = run_job("bench_twins_job.py", 2, env=child_env())
    assert result.returncode == 0, lines.text()
    assert lines.of(0) == lines.of(1) == ["rows 28 wrong 0"]


@pytest.mark.timeout(30)
def test_an_unknown_backend_is_refused_before_anything_starts() -> None:
    out = subprocess.run(
        [CCLCTL, "bench", "--backend", "mpi"], capture_output=True, text=True, timeout=20
    )
    assert out.returncode == 2
    assert "--backend 'mpi' is not one of cclctl, torch, gloo, nccl" in out.stderr
