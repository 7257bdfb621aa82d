"""A job on the ``cclctl`` backend for test_torch_backend_relay.py, run once under
``CCLCTL_STAGE=always`` (every tensor through the relay) and once without (the host path).
Run under a launcher (RANK, WORLD_SIZE, MASTER_*): ``python backend_relay_job.py OUT``.

The collectives through torch's API on float32, int64 and bfloat16 tensors, then DDP
(several buckets), then what the rank's telemetry kept: its relay records (``<comm>/relay``
with ``stages``), in its dump, and the ``cclctl_relay_stage_seconds_total`` series of its
exporter. Each rank writes ``OUT/rank<r>.json``.
"""

import datetime
import json
import os
import sys

import torch
import torch.distributed as dist

import cclctl.torch  # noqa: F401  # registers the backend
from cclctl.telemetry.exporter import MetricsExporter

out_dir = sys.argv[1]
dist.init_process_group("cclctl", timeout=datetime.timedelta(seconds=60))
rank, world = dist.get_rank(), dist.get_world_size()
pg = dist.group.WORLD
doc: dict = {"rank": rank, "results": {}}


def bits(t: torch.Tensor) -> list[int]:
    """A tensor's bytes, to compare runs bit for bit."""
    return t.contiguous().reshape(-1).view(torch.uint8).tolist()


def collectives(dtype: torch.dtype) -> None:
    x = (torch.arange(world * 600, dtype=torch.float64).reshape(world * 200, 3) * (rank + 1)).to(
        dtype
    )
    t = x.clone()
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    got = {"all_reduce max": [t]}
    t = x.clone()
    dist.broadcast(t, src=world - 1)
    got["broadcast"] = [t]
    one = torch.empty(world * x.shape[0], 3, dtype=dtype)
    dist.all_gather_into_tensor(one, x)
    got["all_gather_into_tensor"] = [one]
    outs = [torch.empty_like(x) for _ in range(world)]
    dist.all_gather(outs, x)
    got["all_gather"] = outs
    one = torch.empty(x.shape[0] // world, 3, dtype=dtype)
    dist.reduce_scatter_tensor(one, x, op=dist.ReduceOp.MIN)
    got["reduce_scatter_tensor"] = [one]
    one = torch.empty_like(x)
    dist.all_to_all_single(one, x)
    got["all_to_all_single"] = [one]
    for name, tensors in got.items():
        doc["results"][f"{name} {dtype}"] = [bits(t) for t in tensors]


for dtype in (torch.float32, torch.int64, torch.bfloat16):
    collectives(dtype)


def train() -> tuple[list[float], list[float]]:
    """DDP of several buckets, 4 steps: the losses and the parameters it ends with."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Linear(32, 40), torch.nn.ReLU(), torch.nn.Linear(40, 8)
    )  # fmt: skip
    ddp = torch.nn.parallel.DistributedDataParallel(net, process_group=pg, bucket_cap_mb=0.004)
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(100 + rank)
    losses = []
    for _ in range(4):
        opt.zero_grad()
        loss = ddp(torch.randn(8, 32, generator=gen)).pow(2).mean()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, torch.cat([p.detach().reshape(-1) for p in net.parameters()]).tolist()


doc["losses"], doc["params"] = train()

telemetry = pg.comm.tracer
telemetry.fold()
text = MetricsExporter(telemetry.metrics_view).render().decode()
doc["stage_series"] = sorted(
    line.split(" ")[0] for line in text.splitlines() if line.startswith("cclctl_relay_stage")
)
doc["comm"] = pg.comm.id
doc["dump"] = telemetry.dump("relay test", os.path.join(out_dir, f"dump{rank}.json"))
dist.destroy_process_group()
with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
    json.dump(doc, f)
