"""The wrapper process group in this process (a one-rank gloo job): torch sees the group it
would have made, and every way into a group (Python API, functional collectives, DDP) is
recorded once, with torch's group name and its own seq beside cclctl's.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cclctl.integrations.torch import wrap as cclctl_torch
from cclctl.records import COMPLETED

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")


@pytest.fixture
def one_rank(tmp_path: Path) -> Iterator[None]:
    helper = dist.distributed_c10d._new_process_group_helper
    cclctl_torch.instrument(trace_dir=str(tmp_path), timeout_s=30)
    try:
        dist.init_process_group(
            "gloo", init_method=f"file://{tmp_path / 'rdzv'}", rank=0, world_size=1
        )
        yield
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        cclctl_torch.uninstrument()
        assert dist.distributed_c10d._new_process_group_helper is helper


def _settled() -> list[tuple[object, ...]]:
    sess = cclctl_torch.session()
    assert sess is not None
    deadline = time.monotonic() + 5
    while sess.telemetry.inflight() and time.monotonic() < deadline:
        time.sleep(0.01)  # records close from gloo's thread, at the work's completion
    return [
        (r.comm, r.seq, r.op, r.state, r.count, r.nbytes, r.pg_name, r.torch_seq)
        for r in sess.telemetry.records()
    ]


@pytest.mark.timeout(30)
def test_torch_sees_a_gloo_group_and_its_backend(one_rank: None) -> None:
    world = dist.group.WORLD
    assert isinstance(world, dist.ProcessGroup)
    assert type(world).__name__ == "CclctlProcessGroup"
    assert (dist.get_backend(), world.name(), world.group_name) == ("gloo", "gloo", "0")
    assert type(world._get_backend(torch.device("cpu"))).__name__ == "ProcessGroupGloo"
    sub = dist.new_group([0])
    assert dist.get_backend(sub) == "gloo" and dist.get_process_group_ranks(sub) == [0]
    dist.destroy_process_group(sub)
    t = torch.ones(2)
    assert dist.all_reduce(t) is None and t.tolist() == [1.0, 1.0]


@pytest.mark.timeout(60)
def test_functional_collectives_and_ddp_are_recorded_with_torchs_seq(one_rank: None) -> None:
    import torch.distributed._functional_collectives as fc

    group = dist.group.WORLD
    x = fc.wait_tensor(fc.all_reduce(torch.ones(5), "sum", group))
    g = fc.wait_tensor(fc.all_gather_single(torch.ones(3), 0, group))
    assert x.tolist() == [1.0] * 5 and g.shape == (3,)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 2))
    model(torch.ones(3, 4)).sum().backward()
    recs = _settled()
    assert recs[:2] == [
        ("0:0", 1, "all_reduce", COMPLETED, 5, 20, "0", 1),
        ("0:0", 2, "all_gather", COMPLETED, 3, 12, "0", 2),
    ]
    # DDP: its parameter broadcast at construction, then one bucket of 4*2+2 gradients
    assert recs[-1][2:6] == ("all_reduce", COMPLETED, 10, 40)
    assert [r[1] for r in recs] == [r[7] for r in recs] == list(range(1, len(recs) + 1))


@pytest.mark.timeout(60)
def test_a_ddp_comm_hook_runs_through_the_traced_group(one_rank: None) -> None:
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 2))
    model.register_comm_hook(None, default_hooks.allreduce_hook)
    before = len(_settled())
    model(torch.ones(3, 4)).sum().backward()
    assert model.module.weight.grad is not None
    assert [r[2:6] for r in _settled()[before:]] == [("all_reduce", COMPLETED, 10, 40)]
