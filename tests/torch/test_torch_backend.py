"""The ``cclctl`` torch.distributed backend on real torch (CPU) ranks: every collective equals
gloo's in the same job, a new_group, Work and futures, DDP (with and without a comm hook),
FSDP2 and functional collectives train or compute as on gloo, and the calls are cclctl's
own records (backend_job.py). Plus the backend's parts in this process: host views, the
reductions' names, the progress thread and its Work.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

import torch
import torch.distributed as dist
from torch_jobs import HERE, TORCHRUN, child_env, free_port, run_job

from cclctl.diagnose_io.dumpfile import read_dump
from cclctl.errors import InvalidArgument
from cclctl.integrations.torch.backend.process_group import _splits
from cclctl.integrations.torch.backend.progress import Progress
from cclctl.integrations.torch.backend.views import host_views, redop
from cclctl.integrations.torch.backend.work import CclctlWork

COLLECTIVES = ("all_reduce", "strided", "broadcast", "reduce", "all_gather", "reduce_scatter",
               "all_to_all", "uneven", "mixed", "send_recv", "coalesced",
               "gather_scatter")  # fmt: skip
#: what the runtime records for them (a barrier separates each)
RECORDED = {"all_gather", "all_reduce", "all_to_all", "all_to_allv", "barrier", "broadcast",
            "recv", "reduce", "reduce_scatter", "send"}  # fmt: skip


def _docs(out: Path, world: int) -> dict[int, dict[str, Any]]:
    docs = {r: json.loads((out / f"rank{r}.json").read_text()) for r in range(world)}
    assert sorted(docs) == list(range(world))
    return docs


def _check_job(docs: dict[int, dict[str, Any]], world: int, out: Path) -> None:
    for rank, doc in docs.items():
        assert doc["backend"] == "cclctl"
        expected = {f"{c}/torch.{d}" for c in COLLECTIVES for d in ("float32", "int64")}
        expected |= {
            "all_reduce/torch.bfloat16",
            "all_reduce/torch.float16",
            "all_gather/torch.bool",
        }
        assert set(doc["same"]) == expected
        for key, same in doc["same"].items():
            # half precision sums of more than two ranks: the runtime's order is not gloo's
            rounded = world > 2 and key.endswith("16") and same == "close"
            assert same is True or rounded, (rank, key, same)
        ones, twos = [float(world)] * 5, [2.0 * world] * 5
        assert doc["work"] == [ones, twos, [4.0 * world] * 5, True]
        assert doc["avg"] == [sum(range(1, world + 1)) / world] * 3
        name, op, text = doc["error"]
        assert (name, op) == ("InvalidArgument", "all_gather") and "expected" in text
        assert doc["params_alike"] is True
        assert doc["comm"] == f"0:0-{world - 1}"
        members = "0-1" if world == 2 else f"0,{world - 1}"
        sub = [c for c in doc["comms"] if c != doc["comm"]]
        if rank in (0, world - 1):  # a new_group of ranks 0 and the last: its own comm
            assert doc["sub_same"] is True and sub == [doc["sub_comm"]]
            assert doc["sub_comm"].endswith(f":{members}")
        else:
            assert "sub_comm" not in doc and sub == []
        p2p = {"send", "recv"} if rank < 2 else set()  # ranks 0 and 1 exchange
        assert doc["ops"] == sorted(RECORDED - {"send", "recv"} | p2p)
        dump = read_dump(str(out / f"dump{rank}.json"))  # as `cclctl diagnose` reads it
        assert dump.rank == rank and {r.comm for r in dump.records} == set(doc["comms"])
        assert {r.op for r in dump.records} >= {"all_reduce", "broadcast"}
    for rank, doc in docs.items():
        assert doc["functional_same"] is True, rank  # integer-valued: exact in any order
        ddp, fsdp = doc["ddp"], doc["fsdp"]
        runs = [(ddp["cclctl"], ddp["gloo"]), (ddp["hook"], ddp["gloo"]),
                ((fsdp["cclctl"], []), (fsdp["gloo"], []))]  # fmt: skip
        for (losses, params), (gloo_losses, gloo_params) in runs:
            assert len(losses) == 4
            if world == 2:  # a sum of two is the same whichever rank adds: bit-exact
                assert losses == gloo_losses and params == gloo_params
            else:  # another summation order than gloo's: the same to float rounding
                assert losses == pytest.approx(gloo_losses, rel=1e-5)
                assert params == pytest.approx(gloo_params, rel=1e-4, abs=1e-6)


@pytest.mark.timeout(120)
@pytest.mark.slow  # 7-20 s for 2 ranks on this machine, under load
@pytest.mark.parametrize("world", [2, 4])
def test_every_collective_and_ddp_match_gloo_under_the_launcher(world: int, tmp_path: Path) -> None:
    result, lines = run_job(
        "backend_job.py", world, [str(tmp_path)], env=child_env(), timeout_s=100
    )
    assert result.returncode == 0, lines.text()[-6000:]
    _check_job(_docs(tmp_path, world), world, tmp_path)


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_under_torchrun_cclctls_store_is_beside_torchs(tmp_path: Path) -> None:
    """torchrun sets MASTER_PORT for torch's store; cclctl's is on the port after it."""
    if not Path(TORCHRUN).exists():
        pytest.skip("torchrun is not installed next to this Python")
    port = str(free_port())
    cmd = [TORCHRUN, "--nnodes", "1", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
           "--master-port", port, str(HERE / "backend_job.py"), str(tmp_path)]  # fmt: skip
    env = dict(os.environ, **child_env())
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=130, env=env)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    _check_job(_docs(tmp_path, 2), 2, tmp_path)


# ------------------------------------------------------------------------ in this process
def test_a_contiguous_tensor_is_viewed_in_place_and_a_strided_one_copied_back() -> None:
    t = torch.arange(6, dtype=torch.float32)
    (view,) = host_views([t], "all_reduce", reduces=True)
    view.array[0] = 7
    assert t[0].item() == 7 and not view.copied
    s = torch.zeros(3, 2).t()
    (copy,) = host_views([s], "all_reduce", reduces=True)
    copy.array[...] = range(6)
    assert s.sum().item() == 0  # not yet: the copy goes back when the call ends
    copy.write_back()
    assert s.tolist() == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]


def test_a_parameter_and_a_matrix_are_viewed_flat_in_place() -> None:
    w = torch.nn.Parameter(torch.zeros(2, 3))  # requires grad, as DDP's buckets do not
    (view,) = host_views([w], "all_reduce", reduces=True)
    view.array[...] = range(6)
    assert not view.copied and view.array.shape == (6,)
    assert w.detach().tolist() == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]


def test_a_strided_bfloat16_tensor_reduces_through_ml_dtypes_and_is_copied_back() -> None:
    pytest.importorskip("ml_dtypes")
    s = torch.zeros(3, 2, dtype=torch.bfloat16).t()
    (copy,) = host_views([s], "all_reduce", reduces=True)
    assert copy.array.dtype.name == "bfloat16" and copy.copied
    copy.array += copy.array.dtype.type(1.5)
    copy.write_back()
    assert s.tolist() == [[1.5] * 3] * 2


def test_a_tensor_on_another_device_is_refused_naming_the_relay() -> None:
    with pytest.raises(InvalidArgument, match="device tensors go through the relay") as info:
        host_views([torch.empty(4, device="meta")], "broadcast", reduces=False)
    assert info.value.fields["op"] == "broadcast"


def test_dtypes_numpy_lacks_move_as_bytes_but_do_not_reduce() -> None:
    b = torch.ones(8, dtype=torch.bool)
    (view,) = host_views([b], "broadcast", reduces=False)
    assert view.array.nbytes == 8 and view.array.dtype.name == "uint8"
    with pytest.raises(InvalidArgument, match=r"does not reduce torch\.bool"):
        host_views([b], "all_reduce", reduces=True)


def test_torchs_reductions_by_cclctls_names() -> None:
    names = [redop(op, "all_reduce") for op in (dist.ReduceOp.SUM, dist.ReduceOp.AVG,
             dist.ReduceOp.PRODUCT, dist.ReduceOp.MIN, dist.ReduceOp.MAX)]  # fmt: skip
    assert names == ["sum", "avg", "prod", "min", "max"]
    opts = dist.AllreduceOptions()  # torch passes options holding a ReduceOp object
    opts.reduceOp = dist.ReduceOp(dist.ReduceOp.MAX)
    assert redop(opts.reduceOp, "all_reduce") == "max"
    with pytest.raises(InvalidArgument, match="BAND"):
        redop(dist.ReduceOp.BAND, "all_reduce")


def test_all_to_all_splits_are_checked_in_words() -> None:
    t = torch.empty(6, 2)
    assert _splits([], t, 3, "input") == [2, 2, 2]  # none: equal blocks
    assert _splits([0, 5, 1], t, 3, "input") == [0, 5, 1]
    for bad in ([1, 2], [3, 4, -1], [1, 1, 1]):
        with pytest.raises(InvalidArgument, match=r"input splits .* must be 3 non-negative"):
            _splits(bad, t, 3, "input")
    with pytest.raises(InvalidArgument, match="6 rows are not a multiple of the world size 4"):
        _splits([], t, 4, "output")


def test_splits_on_some_ranks_and_none_on_others_fail_at_once_naming_both_calls() -> None:
    """torch takes it; the ranks' calls differ (one all_to_all, the others all_to_allv), so
    every rank fails in that call, where it would otherwise wait for the others."""
    result, lines = run_job("backend_splits_mix_job.py", 3, timeout_s=90)
    assert result.returncode == 0, lines.text()[-4000:]
    for rank in range(3):
        (said,) = [line for line in lines.of(rank) if line.startswith(("failed", "completed"))]
        assert said.startswith("failed"), lines.text()[-4000:]
        assert "all_to_all(float32, count 6)" in said, said
        assert "all_to_allv(float32, counts by rank)" in said, said


def test_calls_run_in_issue_order_and_an_error_reaches_wait_and_the_future() -> None:
    progress = Progress("test")
    seen: list[int] = []
    try:
        first = CclctlWork(progress.submit(lambda: seen.append(1) or []), "a", progress)
        failing = CclctlWork(progress.submit(_raise), "b", progress)
        last = CclctlWork(progress.submit(lambda: seen.append(3) or [torch.ones(1)]), "c", progress)
        assert last.get_future().wait()[0].item() == 1.0
        assert seen == [1, 3] and first.is_completed() and first.is_success()
        with pytest.raises(InvalidArgument, match="bad call") as info:
            failing.wait()
        assert info.value.fields == {"op": "b", "rank": 1}
        assert isinstance(failing.exception(), InvalidArgument) and not failing.is_success()
    finally:
        progress.close()
    with pytest.raises(RuntimeError, match="destroyed"):
        progress.submit(lambda: [])


def _raise() -> list[Any]:
    raise InvalidArgument("bad call", op="b", rank=1)


def test_a_group_member_that_never_joins_is_named(client: Any) -> None:
    from cclctl.errors import RendezvousError
    from cclctl.runtime.job import subgroup
    from cclctl.store.scope import ScopedStore

    scoped = ScopedStore.for_job(client, "job")
    exchange = subgroup.GroupExchange(scoped, "group/5/x/", [0, 3], 0, 0.2)
    with pytest.raises(RendezvousError, match=r"group 5 of ranks 0,3: ranks 3 never joined"):
        exchange("transport", b"mine")
