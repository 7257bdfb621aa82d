"""`cclctl run` on a real 2-rank gloo job that never mentions cclctl: the job sees exactly
what it sees without cclctl, and every collective is recorded with seqs that match across
ranks. The same job runs once plain and twice instrumented, with each quick wrapper
(module fixtures).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

from torch_jobs import child_env, run_job

pytestmark = pytest.mark.slow  # real gloo jobs through cclctl run

CCLCTL = str(Path(sys.executable).with_name("cclctl"))
WORLD = 2


def _outputs(prefix: list[str], **env: str) -> dict[int, list[dict[str, Any]]]:
    result, lines = run_job("train_job.py", WORLD, ["ops"], env=child_env(**env), prefix=prefix)
    assert result.returncode == 0, lines.text()
    return {r: [json.loads(line) for line in lines.of(r)] for r in range(WORLD)}


@pytest.fixture(scope="module")
def plain() -> dict[int, list[dict[str, Any]]]:
    return _outputs([])


@pytest.fixture(scope="module")
def instrumented() -> dict[int, list[dict[str, Any]]]:
    return _outputs([CCLCTL, "run", "--"])


@pytest.mark.timeout(120)
def test_the_job_sees_the_same_results_return_types_and_errors(
    plain: dict[int, list[dict[str, Any]]], instrumented: dict[int, list[dict[str, Any]]]
) -> None:
    for rank in range(WORLD):
        assert [doc for doc in plain[rank] if "records" in doc] == []  # plain is not traced
        assert instrumented[rank][0] == plain[rank][0]
    results = instrumented[0][0]["results"]
    assert results["all_reduce"] == [1.0, 3.0, 5.0, 7.0]  # a real sum of 0..3 and 1..4
    assert (results["all_reduce.ret"], results["async.ret"], results["recv.ret"]) == (
        "NoneType",
        "Work",
        1,
    )
    assert instrumented[1][0]["results"]["nonmember.ret"] == "NoneType"
    assert results["subgroup"] == [12.0, 12.0]  # 1 + 2, three times over
    assert results["error.not_a_tensor"].startswith("TypeError: Invalid function argument")
    assert results["error.bad_src"].startswith("RuntimeError: ProcessGroupGloo::broadcast")


def _records(out: dict[int, list[dict[str, Any]]], rank: int) -> list[list[Any]]:
    docs = [doc for doc in out[rank] if "records" in doc]
    assert len(docs) == 1
    return docs[0]["records"]


@pytest.mark.timeout(120)
def test_collectives_are_numbered_alike_on_every_rank(
    instrumented: dict[int, list[dict[str, Any]]],
) -> None:
    def collectives(rank: int) -> list[tuple[Any, ...]]:
        # comm, seq, op, state, dtype, count, nbytes, root: what must agree across ranks
        return [tuple(r[:8]) for r in _records(instrumented, rank) if r[8] is None]

    calls = collectives(0)
    assert calls == collectives(1)
    world = [c for c in calls if c[0] == "0:0-1"]
    assert [c[1] for c in world] == list(range(1, len(world) + 1))
    ops = [c[2] for c in world]
    assert ops == [
        "all_reduce",  # sync
        "all_reduce",  # async, closed by the work's future
        "all_gather",  # list form: nbytes is the gathered buffer, as nccl-tests counts
        "all_gather",  # all_gather_into_tensor -> all_gather_single, counted once
        "reduce_scatter",
        "broadcast",
        "reduce",
        "all_to_all",
        "all_to_all",
        "all_gather",  # all_gather_object: sizes, then data
        "all_gather",
        "barrier",
        "broadcast",  # src out of range: torch raised, the record says so
        "all_reduce",  # ReduceOp.AVG
    ]
    by_op = {c[2]: c for c in world}
    assert by_op["all_reduce"][3:7] == ("completed", "float32", 2, 8)
    assert world[2][5:7] == (4, 4 * 4 * WORLD)  # all_gather: count per rank, full nbytes
    assert world[4][5:7] == (2, 2 * 4 * WORLD)  # reduce_scatter: count out, full nbytes in
    assert (world[5][7], world[6][7]) == (WORLD - 1, 0)  # broadcast src, reduce dst
    assert world[12][3] == "failed"
    assert [c for c in calls if c[0] != "0:0-1"] == [
        ("1:0-1", seq, "all_reduce", "completed", "float32", 2, 8, None) for seq in (1, 2, 3)
    ]
    assert all(r[9] > 0 for r in _records(instrumented, 0) if r[3] == "completed")


@pytest.mark.timeout(120)
def test_point_to_point_calls_pair_up_by_their_own_sequence(
    instrumented: dict[int, list[dict[str, Any]]],
) -> None:
    def p2p(rank: int) -> dict[tuple[str, int], tuple[int, int]]:
        return {
            (r[2], r[1]): (r[8], r[6]) for r in _records(instrumented, rank) if r[8] is not None
        }

    zero, one = p2p(0), p2p(1)
    # send, isend and the batch: the k-th send from 0 to 1 is the k-th receive at 1 from 0
    assert sorted(zero) == sorted(one) == [(op, k) for op in ("recv", "send") for k in (1, 2, 3)]
    for k in (1, 2, 3):
        assert zero[("send", k)] == (1, 8) and one[("recv", k)] == (0, 8)
        assert one[("send", k)] == (0, 8) and zero[("recv", k)] == (1, 8)


@pytest.mark.timeout(120)
def test_communicators_list_members_and_progress(
    instrumented: dict[int, list[dict[str, Any]]],
) -> None:
    comms = next(doc for doc in instrumented[1] if "comms" in doc)["comms"]
    assert comms == {"0:0-1": [[0, 1], 14, 14], "1:0-1": [[0, 1], 3, 3]}  # no "2:0": not a member
