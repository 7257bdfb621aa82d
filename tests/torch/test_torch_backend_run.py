"""``cclctl run --backend cclctl -- torchrun ...`` on a gloo script that never mentions
cclctl (gloo_ddp_job.py): the job runs on cclctl's runtime, its records are the runtime
communicator's (an algorithm per call, which the traced gloo wrapper never has), and its
collectives, DDP losses and parameters equal the same script's on gloo under plain
``cclctl run``.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

from torch_jobs import CCLCTL, HERE, TORCHRUN, child_env, free_port, run_job

pytestmark = pytest.mark.slow  # real 2-rank jobs
WORLD = 2


def _docs(out: Path) -> dict[int, dict[str, Any]]:
    return {r: json.loads((out / f"rank{r}.json").read_text()) for r in range(WORLD)}


@pytest.fixture(scope="module")
def on_gloo(tmp_path_factory: pytest.TempPathFactory) -> dict[int, dict[str, Any]]:
    out = tmp_path_factory.mktemp("gloo")
    prefix = [CCLCTL, "run", "--"]
    result, lines = run_job("gloo_ddp_job.py", WORLD, [str(out)], env=child_env(), prefix=prefix)
    assert result.returncode == 0, lines.text()[-4000:]
    return _docs(out)


@pytest.mark.timeout(200)
def test_an_unedited_gloo_job_under_torchrun_runs_on_cclctl_with_gloos_results(
    on_gloo: dict[int, dict[str, Any]], tmp_path: Path
) -> None:
    if not Path(TORCHRUN).exists():
        pytest.skip("torchrun is not installed next to this Python")
    cmd = [CCLCTL, "run", "--backend", "cclctl", "--", TORCHRUN, "--nnodes", "1",
           "--nproc-per-node", str(WORLD), "--master-addr", "127.0.0.1", "--master-port",
           str(free_port()), str(HERE / "gloo_ddp_job.py"), str(tmp_path)]  # fmt: skip
    env = dict(os.environ, **child_env())
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=env)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    moved = _docs(tmp_path)
    for rank in range(WORLD):
        doc, gloo = moved[rank], on_gloo[rank]
        assert (gloo["backend"], gloo["subgroup_backend"]) == ("gloo", "gloo")
        assert (doc["backend"], doc["subgroup_backend"]) == ("cclctl", "cclctl")
        # 2 ranks: a sum of two is the same whichever rank adds, so bit-exact
        assert doc["results"] == gloo["results"]
        assert doc["losses"] == gloo["losses"] and doc["params"] == gloo["params"]
        calls = [tuple(r[:4]) for r in doc["records"]]
        assert calls == [tuple(r[:4]) for r in gloo["records"]]  # the same calls, seqs
        assert {r[4] for r in gloo["records"]} == {""}  # the wrapper knows no algorithm
        assert all(r[4] for r in doc["records"]), doc["records"]  # the runtime's records
        assert {r[0] for r in doc["records"]} == {"0:0-1", "1:0-1"}  # world, new_group
