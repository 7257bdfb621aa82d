"""A real PyTorch DDP job under `cclctl run -- torchrun`, one rank 30% slower in its forward
pass: the case step durations miss (DDP's all_reduce inside backward evens them out) is
named live as a `slow_rank` from the times each rank issues its buckets."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

pytest.importorskip("torch")

from torch_jobs import CCLCTL, HERE, TORCHRUN, free_port, released_job, until_seen

pytestmark = pytest.mark.slow  # four real gloo ranks under torchrun


def _slow(store: str) -> dict | None:
    """`cclctl diagnose slow --store --json`'s document once it has a finding."""
    out = subprocess.run(
        [CCLCTL, "diagnose", "slow", "--store", store, "--json"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    if out.returncode != 3:
        return None
    return json.loads(out.stdout)


@pytest.mark.timeout(240)
def test_a_ddp_rank_30_percent_slower_in_forward_is_the_straggler(tmp_path: Path) -> None:
    if not Path(TORCHRUN).exists():
        pytest.skip("torchrun is not installed next to this Python")
    port, flag = free_port(), tmp_path / "release"
    settings = ["CCLCTL_SLOW_WINDOW=1", "SLOW_RANK=1", "SLOW_EXTRA=0.3"]
    cmd = [
        "env", *settings, CCLCTL, "run", "--", TORCHRUN, "--nnodes", "1", "--nproc-per-node", "4",
        "--master-addr", "127.0.0.1", "--master-port", str(port), "--rdzv-id", "ddpslow",
        str(HERE / "slow_ddp_job.py"), str(flag),
    ]  # fmt: skip
    store = f"127.0.0.1:{port + 1}"
    with released_job(cmd, [flag]) as proc:
        doc = until_seen("a slow finding", lambda: _slow(store), proc, 150)
        flag.touch()
        proc.wait(timeout=60)
    assert [(f["kind"], f["ranks"]) for f in doc["findings"]] == [("slow_rank", [1])], doc
    assert doc["findings"][0]["slowdown"] > 1.15
    assert doc["ranks"]["1"]["wait_share"] < min(doc["ranks"][r]["wait_share"] for r in "023")
    output = proc.stdout.read() if proc.stdout else ""
    assert proc.returncode == 0, output
