"""Training-style gloo jobs whose collectives torch issues from C++, for `cclctl run` to see.
It never calls cclctl. Run under torchrun (RANK, WORLD_SIZE, MASTER_*).

``python model_job.py MODE OUT``: ``ddp`` (a DDP model of several buckets, STEPS
steps), ``fsdp`` (``fully_shard`` per layer and on the model, STEPS steps) or ``compile``
(a ``torch.compile``d function with a functional all_reduce, called CALLS times). Each rank
writes ``OUT/rank<r>.json``: ``expected`` (what torch's own bookkeeping says was issued:
DDP's buckets, first and rebuilt, in bytes, from its logging data) and, when instrumented,
``records`` read from cclctl's session: [comm, seq, op, state, count, nbytes, torch_seq].
"""

import datetime
import json
import os
import sys
import time

import torch
import torch.distributed as dist

STEPS = 3
CALLS = 4
#: DDP's bucket cap (4,194 bytes): once DDP rebuilds its buckets, 3 of them for the 4 layers
#: (its first step has one bucket: torch caps the first at 1 MiB)
BUCKET_CAP_MB = 0.004

mode, out = sys.argv[1], sys.argv[2]
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)


def model() -> torch.nn.Module:
    layers = [torch.nn.Linear(32, 40), torch.nn.Linear(40, 32), torch.nn.Linear(32, 36)]
    return torch.nn.Sequential(*layers, torch.nn.ReLU(), torch.nn.Linear(36, 8))


def ddp() -> dict:
    from torch.nn.parallel import DistributedDataParallel

    net = DistributedDataParallel(model(), bucket_cap_mb=BUCKET_CAP_MB)
    for _ in range(STEPS):
        net(torch.randn(8, 32)).sum().backward()
    data = net._get_ddp_logging_data()
    first, rebuilt = (_ints(data[key]) for key in ("bucket_sizes", "rebuilt_bucket_sizes"))
    params = [p.numel() * p.element_size() for p in net.parameters()]
    return {"first": first, "rebuilt": rebuilt, "param_bytes": params, "steps": STEPS}


def _ints(text: object) -> list[int]:
    """DDP's logging data lists bucket sizes in bytes as ``"4224, 3104"``."""
    return [int(x) for x in str(text).split(",")]


def fsdp() -> dict:
    from torch.distributed.fsdp import fully_shard

    net = model()
    for layer in net:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer)
    fully_shard(net)
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    for _ in range(STEPS):
        net(torch.randn(8, 32)).sum().backward()
        opt.step()
        opt.zero_grad()
    return {"layers": sum(isinstance(x, torch.nn.Linear) for x in net), "steps": STEPS}


def compiled() -> dict:
    import torch.distributed._functional_collectives as fc

    @torch.compile(fullgraph=True)
    def step(x: torch.Tensor) -> torch.Tensor:
        return fc.wait_tensor(fc.all_reduce(x * 2, "sum", dist.group.WORLD)) + 1

    values = [step(torch.full((6,), float(rank + i))).tolist() for i in range(CALLS)]
    return {"calls": CALLS, "values": values}


def records() -> list | None:
    telemetry = sys.modules.get("cclctl.integrations.torch.wrap")
    sess = telemetry.session() if telemetry else None
    if sess is None:
        return None
    deadline = time.monotonic() + 10
    while sess.telemetry.inflight() and time.monotonic() < deadline:
        time.sleep(0.01)  # records close at their works' completion, from gloo's thread
    return [
        [r.comm, r.seq, r.op, r.state, r.count, r.nbytes, r.torch_seq]
        for r in sess.telemetry.records()
    ]


expected = {"ddp": ddp, "fsdp": fsdp, "compile": compiled}[mode]()
with open(os.path.join(out, f"rank{rank}.json"), "w") as fh:  # torchrun mixes stdout lines
    json.dump({"rank": rank, "expected": expected, "records": records()}, fh)
dist.destroy_process_group()
