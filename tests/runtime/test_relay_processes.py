"""The relay in a real launched job (``cclctl launch``, rendezvous, the agent's telemetry),
2 and 4 ranks under ``CCLCTL_STAGE=always``: relayed calls match the unstaged ones bit for
bit, and the rank's exporter and dumps carry their stage times."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from cclctl.launch.launcher import launch
from scripts import script

pytestmark = pytest.mark.slow  # real multi-process jobs
WORKER = script("relay_worker.py")
OPS = 6  # the collectives the worker relays
CALLS = OPS * 2 * 3  # x dtypes x sizes


@pytest.mark.timeout(240)
@pytest.mark.parametrize("n", [2, 4])
def test_a_launched_job_relays_exactly_and_reports_its_stages(n: int, tmp_path: Path) -> None:
    lines: list[tuple[int, str]] = []
    env = {
        "CCLCTL_STAGE": "always", "CCLCTL_STAGE_CHUNK": "16K", "CCLCTL_STAGE_DEPTH": "3",
        "CCLCTL_TRACE_DIR": str(tmp_path), "CCLCTL_TRACE_BUFFER": "100000",
    }  # fmt: skip
    result = launch(
        [sys.executable, WORKER],
        n,
        env=env,
        output=lambda rank, stream, line: lines.append((rank, line)),
        timeout_s=200,
    )
    assert result.returncode == 0, "\n".join(f"[{r}] {line}" for r, line in lines[-40:])
    reports = sorted(
        (json.loads(ln) for _, ln in lines if ln.startswith("{")), key=lambda r: r["rank"]
    )
    assert [r["rank"] for r in reports] == list(range(n))
    for rep in reports:
        assert rep["failures"] == []
        assert rep["stage_series"] == OPS * 3  # d2h, collective, h2d per relayed op
        assert rep["relayed"] == CALLS and rep["with_stages"] == CALLS
