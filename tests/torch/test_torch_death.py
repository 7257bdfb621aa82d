"""A rank of a real torch job (gloo, under `cclctl run -- torchrun`) is SIGKILLed mid-loop:
the survivors whose calls fail name it dead in the job's revoke record, every survivor
carries that one record in its dump, and `cclctl diagnose hang` on the dumps names rank 2
dead, by its pid, as the origin, live ranks' gloo errors being its evidence.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

from torch_jobs import CCLCTL, HERE, TORCHRUN, child_env, free_port

pytestmark = pytest.mark.slow  # a real torch job through cclctl run and torchrun

WORLD = 3
EXIT_FAULT = 3


def _dumps(folder: Path) -> dict[int, dict[str, Any]]:
    docs = {}
    for path in folder.glob("cclctl-*-rank*.json"):
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        docs[int(doc["rank"])] = doc
    return docs


@pytest.mark.timeout(120)
def test_a_killed_torch_rank_is_the_one_origin_every_survivor_reports(tmp_path: Path) -> None:
    if not Path(TORCHRUN).exists():
        pytest.skip("torchrun is not installed next to this Python")
    job, port = "torchdeath", free_port()
    env = dict(os.environ, TMPDIR=str(tmp_path), CCLCTL_STORE_LINGER="3", **child_env())
    env.pop("CCLCTL_TRACE_DIR", None)
    cmd = [
        CCLCTL, "run", "--job", job, "--",
        TORCHRUN, "--nnodes", "1", "--nproc-per-node", str(WORLD), "--master-addr",
        "127.0.0.1", "--master-port", str(port),
        # torchrun stops the survivors once it sees rank 2 gone; looking every 0.1 s (its
        # default), it stopped them under load before their gloo calls had failed
        "--monitor-interval", "5",
        str(HERE / "death_job.py"), str(tmp_path),
    ]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=100, env=env)
    assert out.returncode != 0, out.stdout + out.stderr
    pid = int((tmp_path / "pid.2").read_text())
    errors = {p.name: p.read_text() for p in tmp_path.glob("error.*")}
    assert errors, out.stdout + out.stderr  # some survivor's gloo call failed
    assert all("closed" in e.lower() or "reset" in e.lower() for e in errors.values()), errors

    folder = tmp_path / f"cclctl-{os.getuid()}" / job
    docs = _dumps(folder)
    survivors = sorted(r for r in docs if r != 2)
    assert survivors == [0, 1], sorted(docs)
    records = {r: docs[r].get("revoke") for r in survivors}
    assert all(rec is not None for rec in records.values()), records
    first = records[0]
    assert all(rec == first for rec in records.values()), records  # one record, not one each
    assert (first["kind"], first["origin"], first["pid"]) == ("died", 2, pid), first
    assert first["op"] == "all_reduce" and first["comm"] == f"0:0-{WORLD - 1}", first

    diag = subprocess.run(
        [CCLCTL, "diagnose", "hang", "--job", job, "--json"],
        capture_output=True, text=True, timeout=30, env=env,
    )  # fmt: skip
    assert diag.returncode == EXIT_FAULT, diag.stdout + diag.stderr
    verdict = json.loads(diag.stdout)["verdicts"][0]
    assert (verdict["kind"], verdict["suspects"]) == ("dead", "2"), verdict
    assert verdict["suspect_ranks"][0]["pid"] == pid
    assert any("revoke record" in line for line in verdict["evidence"]), verdict["evidence"]
