"""A hang on the ``cclctl`` backend is named by ``cclctl diagnose hang --store`` live, with no
wrapper in between: the backend's calls are the runtime's records (backend_hang_job.py).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

from torch_jobs import CCLCTL, HERE, TORCHRUN, child_env, free_port, released_job, until_seen

pytestmark = pytest.mark.slow  # a real torchrun job

EXIT_FAULT = 3


def _verdict(store: str, job: str, env: dict[str, str], seen: list[Any]) -> dict[str, Any] | None:
    """The first verdict of ``cclctl diagnose hang`` once it is a fault."""
    cmd = [CCLCTL, "diagnose", "hang", "--store", store, "--job", job, "--json"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=30, env=env)
    seen[:] = [out.returncode, out.stdout[-1500:], out.stderr[-500:]]
    if out.returncode != EXIT_FAULT:
        return None
    verdicts = json.loads(out.stdout).get("verdicts") or []
    return verdicts[0] if verdicts else None


@pytest.mark.timeout(150)
def test_a_rank_that_never_enters_is_named_live(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not Path(TORCHRUN).exists():
        pytest.skip("torchrun is not installed next to this Python")
    port, flag, job = free_port(), tmp_path / "go", "backend-hang"
    monkeypatch.setenv("CCLCTL_JOB", job)  # the job's and the CLI's
    monkeypatch.setenv("CCLCTL_TIMEOUT", "120")  # no watchdog expiry meanwhile
    env = dict(os.environ, **child_env())
    cmd = [TORCHRUN, "--nnodes", "1", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
           "--master-port", str(port), str(HERE / "backend_hang_job.py"), str(flag)]  # fmt: skip
    entered = tmp_path / "go.entered0"
    with released_job(cmd, [flag]) as proc:
        until_seen("rank 0 in the all_reduce", entered.exists, proc, 90)
        seq = int(entered.read_text())
        seen: list[Any] = []
        store = f"127.0.0.1:{port + 1}"  # cclctl's store, beside torch's
        verdict = until_seen("a verdict", lambda: _verdict(store, job, env, seen), proc, 60, seen)
        assert verdict["kind"] == "not_entered" and verdict["suspects"] == "1"
        assert (verdict["comm"], verdict["seq"], verdict["op"]) == ("0:0-1", seq, "all_reduce")
        flag.touch()
        assert proc.wait(timeout=60) == 0
