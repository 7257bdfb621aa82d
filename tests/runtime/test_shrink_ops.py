"""Shrinking away a dead rank in the calls beside all_reduce: broadcast and reduce re-run
among the survivors, their root renumbered; all_gather and all_to_allv, whose buffers are
sized for the old world, raise on every survivor, saying so.

Real jobs of four ranks (``shrink_ops_worker.py``) with ``CCLCTL_ON_FAILURE=shrink``:
rank 2 SIGKILLs itself before entering seq 5, iteration 2's broadcast, reduce, all_gather
or all_to_allv
(each iteration is that call, then an all_reduce that gives every rank its result). The
root is the job's rank 3, rank 2 of the survivors (and rank 0 for a broadcast too). Every
rank's contribution names it, so a result says exactly which ranks it summed.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from shrink_job import ShrinkJob

pytestmark = [pytest.mark.slow, pytest.mark.timeout(90)]

WORKER = str(Path(__file__).parents[1] / "support" / "shrink_ops_worker.py")
WORLD, DEAD, ROOT, ITERS = 4, 2, 3, 6
KILLED_ITER = 2  # seq 5: each iteration makes two calls
SURVIVORS = [r for r in range(WORLD) if r != DEAD]


def _job(tmp: Path, op: str, transport: str, root: int = ROOT) -> ShrinkJob:
    return ShrinkJob(
        tmp, WORLD, iters=ITERS, worker=WORKER, OP=op, ROOT=str(root),
        CCLCTL_ON_FAILURE="shrink", CCLCTL_TRANSPORT=transport,
        CCLCTL_FAULT=f"kill:rank={DEAD}:seq={2 * KILLED_ITER + 1}:comm=0:0-{WORLD - 1}",
    )  # fmt: skip


def _run(tmp: Path, op: str, transport: str, root: int = ROOT) -> dict[int, dict[str, object]]:
    job = _job(tmp, op, transport, root)
    try:
        docs = job.outcome(SURVIVORS)
    finally:
        job.finish()
    for rank, doc in docs.items():
        assert doc["members"] == SURVIVORS and doc["shrinks"] == [[DEAD]], doc
        assert doc["new_rank"] == SURVIVORS.index(rank)
    return docs


@pytest.mark.parametrize("transport", ["auto", "tcp"])
@pytest.mark.parametrize("root", [ROOT, 0])
def test_a_broadcast_a_death_interrupted_re_runs_from_the_renumbered_root(
    tmp_path: Path, transport: str, root: int
) -> None:
    """Every survivor holds the root's value in every iteration (the all_reduce sums it
    over the four ranks before the death, over the three survivors from it on). From rank
    0 over TCP the ranks the dead one did not forward to complete the broadcast: the
    others take its result from them (the catch-up); from rank 3 all re-run it."""
    docs = _run(tmp_path, "broadcast", transport, root)
    for doc in docs.values():
        n = [WORLD if i < KILLED_ITER else WORLD - 1 for i in range(ITERS)]
        assert doc["results"] == [n[i] * (root + 1) * (i + 1) for i in range(ITERS)], doc


@pytest.mark.parametrize("transport", ["auto", "tcp"])
def test_a_reduce_a_death_interrupted_re_runs_among_the_survivors_to_the_root(
    tmp_path: Path, transport: str
) -> None:
    """The root's sum holds every rank's part before the death and exactly the survivors'
    from the interrupted iteration on: no dead rank's part, no survivor's twice."""
    docs = _run(tmp_path, "reduce", transport)
    everyone, survivors = sum(r + 1 for r in range(WORLD)), sum(r + 1 for r in SURVIVORS)
    for doc in docs.values():
        sums = [everyone if i < KILLED_ITER else survivors for i in range(ITERS)]
        assert doc["results"] == [sums[i] * (i + 1) for i in range(ITERS)], doc


@pytest.mark.parametrize("op", ["all_gather", "all_to_allv"])
def test_a_call_sized_by_the_world_a_death_interrupted_raises_on_every_survivor_saying_why(
    tmp_path: Path, op: str
) -> None:
    """Its buffers are sized for four ranks: every survivor raises once the communicator
    has shrunk, naming the old and new world sizes, instead of returning a partial result."""
    job = _job(tmp_path, op, "tcp")
    try:
        for rank in SURVIVORS:
            out, _ = job.procs[rank].communicate(timeout=60)
            assert job.procs[rank].returncode == 3, out.decode()
            line = next(x for x in out.decode().splitlines() if "failed:" in x)
            assert "shrank to 3 ranks without rank(s) 2" in line, line
            assert f"{op} cannot re-run itself: its buffers are sized for the 4" in line
    finally:
        job.finish()
