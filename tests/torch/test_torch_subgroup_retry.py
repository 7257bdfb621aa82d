"""A link fault inside a ``new_group`` on the ``cclctl`` backend is ridden through by the
group's own retry (``CCLCTL_RETRY_BUDGET``, on by default), among its members alone: three
real torch (CPU) ranks over TCP, a group of ranks 1 and 2, rank 2 closing its link to the
group's rank 0 before the group's second all_reduce (``CCLCTL_FAULT=link:...:comm=<id>``).
Every result is the exact one; the members' records show that call's failed attempt and
its retry in the group's next epoch; the world never retried (subgroup_retry_job.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")

from torch_jobs import child_env, run_job

pytestmark = pytest.mark.slow  # a real 3-rank job
WORLD, MEMBERS = 3, [1, 2]
SUB = "1:1-2"  # torch's first new_group: group name 1, ranks 1 and 2


def _expected(i: int) -> list[float]:
    """The group's i-th sum: sum over members of arange * (rank + 1) + i (exact)."""
    scale = sum(r + 1 for r in MEMBERS)
    head = [float(k * scale + len(MEMBERS) * i) for k in range(8)]
    return [*head, float(scale * 4095 * 4096 // 2 + len(MEMBERS) * i * 4096)]


@pytest.mark.timeout(180)
def test_a_link_fault_in_a_new_group_is_retried_and_its_results_are_exact(
    tmp_path: Path,
) -> None:
    env = child_env(CCLCTL_TRANSPORT="tcp", CCLCTL_FAULT=f"link:rank=2:seq=2:peer=0:comm={SUB}")
    result, lines = run_job("subgroup_retry_job.py", WORLD, [str(tmp_path)], env=env,
                            timeout_s=150)  # fmt: skip
    assert result.returncode == 0, lines.text()[-6000:]
    docs = {r: json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(WORLD)}
    world_sum = [float(sum(range(1, WORLD + 1)))] * 8
    for rank, doc in docs.items():
        assert doc["world"] == world_sum, rank
        world = [r for r in doc["records"] if r[0] == f"0:0-{WORLD - 1}"]
        assert world and all(r[3] == "completed" and r[4:] == [0, 1] for r in world), world
        if rank not in MEMBERS:
            assert doc["sub"] == [] and {r[0] for r in doc["records"]} == {world[0][0]}
            continue
        assert doc["sub_comm"] == SUB
        assert doc["sub"] == [_expected(i) for i in range(3)], rank
        seq2 = [r for r in doc["records"] if r[:2] == [SUB, 2]]
        assert [(r[2], r[4], r[5]) for r in seq2] == [("all_reduce", 0, 1), ("all_reduce", 1, 2)]
        assert seq2[0][3] in ("failed", "aborted") and seq2[1][3] == "completed", seq2
        later = [r for r in doc["records"] if r[0] == SUB and r[1] > 2]
        assert later and all(r[3] == "completed" and r[4] == 1 for r in later), later
