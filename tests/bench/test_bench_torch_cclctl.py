"""`cclctl bench --backend torch-cclctl`: the sweep through torch.distributed's ``cclctl``
backend (cclctl's runtime behind torch's API), checked like gloo's, in one table format."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")

from test_bench_cli import _run

pytestmark = pytest.mark.slow  # cclctl bench on real torch ranks

OPS = "all_reduce,all_gather,reduce_scatter,broadcast,reduce,alltoall,sendrecv"
QUIET = {"PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"}


@pytest.mark.timeout(150)
@pytest.mark.parametrize("stage", ["auto", "always"])
def test_a_two_rank_sweep_on_the_cclctl_backend_checks_clean(stage: str) -> None:
    """``always``: the backend relays every CPU tensor itself (no stage columns here)."""
    code, out, err = _run(
        ["bench", "--backend", "torch-cclctl", "--stage", stage, "-g", "2", "-b", "8",
         "-e", "16K", "-f", "16", "-n", "2", "-w", "1", "--collective", OPS, "-J", "-"],
        env={**QUIET, "CCLCTL_STAGE_CHUNK": "4K"},
        timeout=140,
    )  # fmt: skip
    assert code == 0, err
    doc = json.loads(out)
    assert doc["meta"]["backend"] == "torch-cclctl" and doc["ok"] is True
    assert doc["meta"].get("stage", "auto") == stage
    rows = doc["rows"]
    assert sorted({r["op"] for r in rows}) == sorted(OPS.split(","))
    assert all(r["out_of_place"]["#wrong"] == 0 for r in rows)
    assert all(r["in_place"]["#wrong"] in (0, None) for r in rows)  # in-place sendrecv: unchecked
    assert all("stages" not in r["out_of_place"] for r in rows)
    assert "backend: torch-cclctl" in err  # the table goes to stderr with -J -
