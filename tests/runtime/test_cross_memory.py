"""Single-copy collectives: ranks of one host move plain buffers through each other's memory
(``process_vm_readv``/``writev``), found out by a probe, never assumed.

Real rank processes (thread ranks share one process, which the kernel always lets reach
itself), results checked bit for bit against numpy in rank order; the probe refuses a pid
that is not the rank's; a rank that is gone fails a read naming it; a killed rank fails the
survivors fast.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from typing import Any

import numpy as np
import pytest
from bare_ranks import run_bare
from cma_worker import inputs

from cclctl.errors import PeerError
from cclctl.runtime.transport import wire
from cclctl.runtime.transport.shm import cross_memory
from cclctl.runtime.transport.shm import segment as shm_segment
from cclctl.runtime.transport.shm.layout import W_CROSS, W_PID, Layout, View
from cclctl.runtime.transport.shm.transport import usable_cpus
from scripts import script

WORKER = script("cma_worker.py")
TOKEN = "cma-test-token-0123456789abcdefghijklm"
COUNT = 300_007  # 1.2 MiB of float32 per rank: every call runs single-copy, shares uneven

pytestmark = pytest.mark.skipif(not shm_segment.available(), reason="no writable /dev/shm")


def run_job(n: int, job: str, stuck: int | None = None, **env: str) -> list[dict[str, Any]]:
    """``n`` bare rank processes of ``cma_worker.py``, by rank; rank ``stuck`` (stopped by
    a fault) is killed once the others have ended."""
    lines = run_bare(WORKER, n, job, TOKEN, stuck=stuck, COUNT=str(COUNT), **env)
    return sorted(lines, key=lambda line: line["rank"])


def in_rank_order(fn: Any, arrays: list[np.ndarray]) -> np.ndarray:
    out = fn(arrays[0], arrays[1])
    for arr in arrays[2:]:
        out = fn(out, arr)
    return out


def expected(n: int, rank: int) -> dict[str, str]:
    xs = [inputs(r, COUNT) for r in range(n)]
    ints = [(np.arange(COUNT, dtype=np.int64) % 5) + r + 1 for r in range(n)]
    block = [inputs(j + 10 * rank, COUNT) for j in range(n)]
    want = {
        "all_reduce_sum_in_place": in_rank_order(np.add, xs),
        "all_reduce_max": in_rank_order(np.maximum, xs),
        "all_reduce_min": in_rank_order(np.minimum, xs),
        "all_gather": np.concatenate(xs),
        "all_gather_in_place": np.concatenate(xs),
        "reduce_scatter": in_rank_order(np.add, block),
        "reduce_scatter_in_place": in_rank_order(np.add, block),
        "all_reduce_prod_int64": in_rank_order(np.multiply, ints),
        "all_to_all": np.concatenate([inputs(i + 100 * rank, COUNT) for i in range(n)]),
        "all_to_all_in_place": np.concatenate([inputs(i + 100 * rank, COUNT) for i in range(n)]),
    }
    return {name: hashlib.sha256(arr.tobytes()).hexdigest() for name, arr in want.items()}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("n", [2, 3, 4])
def test_rank_processes_run_single_copy_with_the_rank_order_bits(n: int) -> None:
    lines = run_job(n, f"cma-{n}-{os.getpid()}", CCLCTL_SHM_CMA="always")
    assert [line["rank"] for line in lines] == list(range(n)), lines
    for line in lines:
        assert line["transport"] == "shm"
        assert line["algos"] == ["shm_cma"]
        assert line["src_kept"]
        assert line["results"] == expected(n, line["rank"])


@pytest.mark.timeout(120)
def test_turned_off_the_same_calls_run_through_the_slots_with_the_same_bits() -> None:
    lines = run_job(3, f"cma-off-{os.getpid()}", CCLCTL_SHM_CMA="never")
    assert len(lines) == 3, lines
    for line in lines:
        assert "shm_cma" not in line["algos"]
        assert line["results"] == expected(3, line["rank"])


@pytest.mark.timeout(120)
def test_by_default_ranks_that_outnumber_the_cores_keep_the_slots() -> None:
    cores = usable_cpus()
    if cores > 4:
        pytest.skip(f"{cores} cores: a job of {cores + 1} ranks is too large for a unit test")
    crowded = run_job(cores + 1, f"cma-crowded-{os.getpid()}")
    assert len(crowded) == cores + 1, crowded
    assert all("shm_cma" not in line["algos"] for line in crowded)
    if cores >= 2:
        roomy = run_job(2, f"cma-roomy-{os.getpid()}")
        assert [line["algos"] for line in roomy] == [["shm_cma"]] * 2


@pytest.mark.timeout(120)
def test_a_killed_rank_fails_the_survivors_fast_naming_it() -> None:
    lines = run_job(
        3,
        f"cma-kill-{os.getpid()}",
        LOOP="1000000",
        CCLCTL_FAULT="kill:rank=1:seq=40",
        CCLCTL_TIMEOUT="60",
        CCLCTL_SHM_CMA="always",
    )
    errors = [line for line in lines if "error" in line]
    assert sorted(line["rank"] for line in errors) == [0, 2], lines
    assert {line["error"] for line in errors} <= {"PeerError", "CommRevoked"}
    assert all("rank 1" in str(line["message"]) for line in errors)


@pytest.mark.timeout(120)
def test_a_stopped_rank_is_named_by_the_survivors_when_they_time_out() -> None:
    lines = run_job(
        3,
        f"cma-stop-{os.getpid()}",
        stuck=1,
        LOOP="1000000",
        CCLCTL_FAULT="stop:rank=1:seq=40",
        CCLCTL_TIMEOUT="3",
        CCLCTL_SHM_CMA="always",
    )
    errors = [line for line in lines if "error" in line]
    assert sorted(line["rank"] for line in errors) == [0, 2], lines
    assert {line["error"] for line in errors} <= {"CollectiveTimeout", "CommRevoked"}
    assert all("rank 1" in str(line["message"]) for line in errors), errors


# ---------------------------------------------------------------- the engine in process
def _segment_view(rank: int, tmp_name: str) -> View:
    layout = Layout(2)
    seg = shm_segment.Segment.create(tmp_name, layout.size)
    view = View(seg, layout, rank)
    view.init_owner()
    return view


@pytest.fixture
def views() -> Any:
    made = [_segment_view(r, f"cclctl-cmatest-{os.getpid()}-{r}") for r in range(2)]
    yield made
    for view in made:
        view.segment.unlink()
        view.release()


def test_the_probe_agrees_where_every_rank_read_every_token(views: list[View]) -> None:
    for view in views:
        cross_memory.offer(view)
    for view in views:
        cross_memory.probe(view, [v for v in views if v is not view])
    engine = cross_memory.agreed(0, views)
    assert engine is not None
    data = np.arange(1000, dtype=np.float64)
    got = np.empty_like(data)
    call = wire.Call(comm=1, epoch=0, seq=7, op="all_reduce", dtype="float64", count=1000)
    engine.read(1, data.ctypes.data, got, call)  # this process is "rank 1" here too
    assert got.tobytes() == data.tobytes()
    engine.write(1, got.ctypes.data, np.zeros(1000), call)
    assert not got.any()


def test_the_probe_refuses_a_pid_that_is_not_the_ranks(views: list[View]) -> None:
    """As in another pid namespace: the published pid names some other process."""
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        for view in views:
            cross_memory.offer(view)
        views[1].i[W_PID] = other.pid
        cross_memory.probe(views[0], [views[1]])
        cross_memory.probe(views[1], [views[0]])
        assert views[0].i[W_CROSS] == cross_memory.CROSS_NO
        assert views[1].i[W_CROSS] == cross_memory.CROSS_YES
        assert cross_memory.agreed(1, views) is None  # one rank could not: none uses it
    finally:
        other.kill()
        other.wait(5)


def test_turned_off_the_probe_says_no(views: list[View]) -> None:
    for view in views:
        cross_memory.offer(view)
    cross_memory.probe(views[0], [views[1]], enabled=False)
    cross_memory.probe(views[1], [views[0]])
    assert cross_memory.agreed(0, views) is None


def test_a_read_from_a_rank_whose_process_is_gone_names_it() -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    engine = cross_memory.CrossMemory(0, {3: gone.pid})
    call = wire.Call(comm=1, epoch=0, seq=9, op="all_reduce", dtype="float32", count=4)
    with pytest.raises(PeerError) as err:
        engine.read(3, 4096, np.empty(4, np.float32), call)
    assert err.value.fields["peer"] == 3
    assert "rank 3's process exited" in str(err.value)
    assert "at seq 9" in str(err.value)


def test_a_read_from_memory_that_is_not_there_fails_naming_the_rank() -> None:
    engine = cross_memory.CrossMemory(0, {1: os.getpid()})
    call = wire.Call(comm=1, epoch=0, seq=2, op="all_gather", dtype="float32", count=4)
    with pytest.raises(PeerError) as err:
        engine.read(1, 8, np.empty(4, np.float32), call)  # page 0 is never mapped
    assert err.value.fields["peer"] == 1
    assert "cannot read from its memory: Bad address" in str(err.value)
