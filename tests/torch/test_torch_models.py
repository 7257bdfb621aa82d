"""DDP, FSDP2 and a torch.compile'd functional all_reduce under `cclctl run -- torchrun`:
collectives torch issues from C++ are counted, with exact numbers and sizes computed from
the model and from torch's own bookkeeping (DDP's logging data), on 2 and 4 ranks.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

from torch_jobs import HERE, child_env, free_port

pytestmark = pytest.mark.slow  # real gloo jobs through cclctl run and torchrun

CCLCTL = str(Path(sys.executable).with_name("cclctl"))
TORCHRUN = str(Path(sys.executable).with_name("torchrun"))


def _run(mode: str, world: int, out_dir: Path) -> dict[int, dict[str, Any]]:
    """Every rank's JSON line; the records of the world group, as [seq, op, state, count,
    nbytes, torch_seq]."""
    if not Path(TORCHRUN).exists():
        pytest.skip("torchrun is not installed next to this Python")
    cmd = [
        CCLCTL, "run", "--", TORCHRUN, "--nnodes", "1", "--nproc-per-node", str(world),
        "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
        str(HERE / "model_job.py"), mode, str(out_dir),
    ]  # fmt: skip
    env = dict(os.environ, **child_env())
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=110, env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    docs = [json.loads(p.read_text()) for p in sorted(out_dir.glob("rank*.json"))]
    by_rank = {doc["rank"]: doc for doc in docs}
    assert sorted(by_rank) == list(range(world)), out.stdout
    comm = f"0:0-{world - 1}"
    for doc in by_rank.values():
        assert doc["records"] is not None, "not instrumented"
        assert {r[0] for r in doc["records"]} == {comm}
        doc["world"] = [r[1:] for r in doc["records"]]
        assert [r[0] for r in doc["world"]] == list(range(1, len(doc["world"]) + 1))
        assert all(r[2] == "completed" for r in doc["world"])
        assert [r[5] for r in doc["world"]] == [r[0] for r in doc["world"]]  # torch's seq
    assert len({json.dumps(doc["world"]) for doc in by_rank.values()}) == 1  # alike on all
    return by_rank


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world", [2, 4])
def test_every_ddp_gradient_all_reduce_is_counted(world: int, tmp_path: Path) -> None:
    for doc in _run("ddp", world, tmp_path).values():
        expected = doc["expected"]
        first, rebuilt, params = expected["first"], expected["rebuilt"], expected["param_bytes"]
        assert len(rebuilt) >= 3 and sum(rebuilt) == sum(first) == sum(params)
        buckets = first + rebuilt * (expected["steps"] - 1)  # DDP rebuilds after step 1
        reduces = [(r[3], r[4]) for r in doc["world"] if r[1] == "all_reduce"]
        assert reduces == [(b // 4, b) for b in buckets]  # float32 gradients


def _fsdp_sizes(world: int) -> list[tuple[int, int]]:
    """Per layer of model_job's model: elements per rank of its flat shard (each parameter
    split along dim 0, padded to the world), and the gathered buffer's bytes."""
    layers = [(32, 40), (40, 32), (32, 36), (36, 8)]  # (in, out) of each Linear
    sizes = []
    for fan_in, out in layers:
        rows = -(-out // world)
        count = rows * fan_in + rows
        sizes.append((count, count * world * 4))
    return sizes


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world", [2, 4])
def test_fsdp2_all_gathers_and_reduce_scatters_are_counted(world: int, tmp_path: Path) -> None:
    for doc in _run("fsdp", world, tmp_path).values():
        steps = doc["expected"]["steps"]
        sizes = _fsdp_sizes(world)

        def of(op: str, recs: list[list[Any]] = doc["world"]) -> Counter[tuple[int, int]]:
            return Counter((r[3], r[4]) for r in recs if r[1] == op)

        # each step gathers every layer for forward and again for backward (resharded after
        # forward), and reduce-scatters each layer's gradients once
        assert of("all_gather") == Counter({s: 2 * steps for s in sizes})
        assert of("reduce_scatter") == Counter({s: steps for s in sizes})
        assert {r[1] for r in doc["world"]} == {"all_gather", "reduce_scatter"}


@pytest.mark.timeout(120)
def test_a_compiled_functional_all_reduce_is_counted(tmp_path: Path) -> None:
    world = 2
    for doc in _run("compile", world, tmp_path).values():
        calls = doc["expected"]["calls"]
        assert doc["world"] == [[k, "all_reduce", "completed", 6, 24, k] for k in range(1, 5)]
        assert len(doc["world"]) == calls
        sums = [sum(2.0 * (r + i) for r in range(world)) + 1 for i in range(calls)]
        assert doc["expected"]["values"] == [[s] * 6 for s in sums]
