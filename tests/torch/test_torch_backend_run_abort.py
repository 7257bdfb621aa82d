"""``cclctl abort`` on an unedited gloo job moved onto the ``cclctl`` backend (``cclctl run
--backend cclctl``): the ranks blocked in an all_reduce (the last rank stays in its own code,
train_job.py's ``hang``) each fail that call with the operator's reason, which torch raises
in the job, and abort hears every rank acknowledge.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

from ports import free_port_block
from torch_jobs import CCLCTL, HERE, PY, child_env, released_job, until_seen

pytestmark = pytest.mark.slow  # a real 3-rank job
WORLD, JOB, REASON = 3, "moved-abort", "bad data shard"
EXIT_FAULT = 3


def _hung(store: str, env: dict[str, str], seen: list[Any]) -> bool:
    """Whether ``cclctl diagnose hang`` finds the job hung (its ranks 0-1 in the call)."""
    cmd = [CCLCTL, "diagnose", "hang", "--store", store, "--job", JOB, "--json"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=30, env=env)
    seen[:] = [out.returncode, out.stdout[-1500:], out.stderr[-500:]]
    return out.returncode == EXIT_FAULT


@pytest.mark.timeout(200)
def test_abort_fails_every_blocked_ranks_call_with_the_operators_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    port, flag = free_port_block(1), tmp_path / "go"
    for name, value in {"CCLCTL_JOB": JOB, "CCLCTL_TRACE_DIR": str(tmp_path),
                        "CCLCTL_TIMEOUT": "120"}.items():  # fmt: skip
        monkeypatch.setenv(name, value)  # the job's and the CLI's (abort reads the token there)
    env = dict(os.environ, **child_env())
    moved = [CCLCTL, "run", "--backend", "cclctl", "--"]
    job = [PY, str(HERE / "train_job.py"), "hang", str(flag)]
    cmd = [CCLCTL, "launch", "-n", str(WORLD), "--port", str(port), "--", *moved, *job]
    store = f"127.0.0.1:{port}"
    with released_job(cmd, [flag]) as proc:
        seen: list[Any] = []
        until_seen("the hang", lambda: _hung(store, env, seen), proc, 120, seen)
        abort = [CCLCTL, "abort", "--store", store, "--job", JOB, "--reason", REASON]
        told = subprocess.run(
            [*abort, "--wait", "20"], capture_output=True, text=True, env=env, timeout=60
        )
        assert told.returncode == 0, told.stdout + told.stderr
        assert f"ranks 0-{WORLD - 2}: in all_reduce" in told.stdout
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode != 0, out
    for rank in range(WORLD - 1):
        failed = [line for line in out.splitlines() if line.startswith(f"[rank {rank}]")]
        assert any("all_reduce" in line and "by operator" in line and REASON in line
                   for line in failed), out[-3000:]  # fmt: skip
