"""A link fault below DDP on the ``cclctl`` backend is ridden through by the runtime's retry
(``CCLCTL_RETRY_BUDGET``, on by default): the same unedited gloo job (gloo_ddp_job.py, no
backend named: torch's choice on a CPU host) under ``cclctl run --backend cclctl`` over TCP,
once undisturbed and once with rank 1 closing its link to rank 0 for good before a DDP
gradient bucket's all_reduce (``CCLCTL_FAULT=link``), trains to the same losses and
parameters; the records show the failed attempt and its retry in the next epoch.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

from torch_jobs import CCLCTL, child_env, run_job

pytestmark = pytest.mark.slow  # two real 2-rank jobs
WORLD = 2
#: the world's seq 12: a gradient bucket of DDP's second step (gloo_ddp_job.py: 4 calls,
#: DDP's shape check and 2 broadcasts, step 1's bucket and loss, 2 broadcasts of the
#: rebuilt buckets, then 2 buckets and a loss per step)
SEQ = 12


def _train(out: Path, **env: str) -> dict[int, dict[str, Any]]:
    prefix = [CCLCTL, "run", "--backend", "cclctl", "--"]
    env = child_env(CCLCTL_TRANSPORT="tcp", **env)
    result, lines = run_job(
        "gloo_ddp_job.py", WORLD, [str(out), "none"], env=env, prefix=prefix, timeout_s=120
    )
    assert result.returncode == 0, lines.text()[-4000:]
    return {r: json.loads((out / f"rank{r}.json").read_text()) for r in range(WORLD)}


@pytest.mark.timeout(300)
def test_a_link_closed_below_ddp_is_retried_and_training_is_unchanged(tmp_path: Path) -> None:
    for name in ("calm", "fault"):
        (tmp_path / name).mkdir()
    calm = _train(tmp_path / "calm")
    fault = _train(tmp_path / "fault", CCLCTL_FAULT=f"link:rank=1:seq={SEQ}:peer=0:comm=0:0-1")
    for rank in range(WORLD):
        assert fault[rank]["backend"] == "cclctl"
        assert fault[rank]["results"] == calm[rank]["results"]
        assert fault[rank]["losses"] == calm[rank]["losses"]
        assert fault[rank]["params"] == calm[rank]["params"]
        assert [r for r in calm[rank]["records"] if r[5:] != [0, 1]] == []  # no retry
        attempts = [r for r in fault[rank]["records"] if r[:2] == ["0:0-1", SEQ]]
        # the rank that hit the link failed, its peer's attempt was ended by the spread
        assert [(r[2], r[5], r[6]) for r in attempts] == [
            ("all_reduce", 0, 1),
            ("all_reduce", 1, 2),
        ]
        assert attempts[0][3] in ("failed", "aborted") and attempts[1][3] == "completed"
        later = [r for r in fault[rank]["records"] if r[0] == "0:0-1" and r[1] > SEQ]
        assert later and all(r[3] == "completed" and r[5] == 1 for r in later)
