"""`cclctl probe` run bare: spawned local ranks over shared memory, rank 0 reporting."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


def _probe(*args: str) -> subprocess.CompletedProcess[str]:
    env_cmd = [sys.executable, "-m", "cclctl", "probe", *args]
    return subprocess.run(env_cmd, capture_output=True, text=True, timeout=100)


def test_four_healthy_local_ranks_pass(tmp_path: Path) -> None:
    out = _probe("-g", "4", "-e", "1M", "-J", str(tmp_path / "probe.json"))
    assert out.returncode == 0, out.stdout + out.stderr
    doc = json.loads((tmp_path / "probe.json").read_text())
    assert doc["schema"] == "cclctl.probe" and doc["ok"] is True and doc["rounds"] == 3
    assert len(doc["links"]) == 12
    assert all(x["status"] == "ok" and x["kind"] == "shm" for x in doc["links"])
    assert all(x["bandwidth"] > 0 and x["latency"] > 0 for x in doc["links"])
    assert "src\\dst" in out.stdout and "all 12 links pass" in out.stdout


def test_an_odd_count_sits_one_rank_out_each_round_and_the_document_goes_to_stdout() -> None:
    out = _probe("-g", "3", "-e", "64K", "--direction", "both", "-J", "-")
    assert out.returncode in (0, 3), out.stderr
    doc = json.loads(out.stdout)
    assert doc["rounds"] == 3 and len(doc["links"]) == 6 and doc["direction"] == "both"
    assert "src\\dst" in out.stderr  # the table moved to stderr


def test_a_baseline_far_above_every_link_flags_them_all(tmp_path: Path) -> None:
    """A known-good run's document as the baseline: a node 1000x slower fails pre-flight."""
    first = _probe("-g", "2", "-e", "256K", "-J", str(tmp_path / "good.json"))
    assert first.returncode == 0, first.stderr  # two links alone: nothing to judge them by
    doc = json.loads((tmp_path / "good.json").read_text())
    for link in doc["links"]:
        link["bandwidth"] *= 1000
    (tmp_path / "fast.json").write_text(json.dumps(doc))
    out = _probe("-g", "2", "-e", "256K", "--baseline", str(tmp_path / "fast.json"))
    assert out.returncode == 3, out.stdout + out.stderr
    assert out.stdout.count("slow_link: rank") == 2
