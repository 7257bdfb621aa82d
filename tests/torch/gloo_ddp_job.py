"""A plain gloo job (a few collectives, then DDP training) that never mentions cclctl, for
``cclctl run --backend cclctl``: the same script on gloo and moved onto cclctl's runtime.
Run under a launcher (RANK, WORLD_SIZE, MASTER_*): ``python gloo_ddp_job.py OUT [none]``
(``none``: ``init_process_group()`` with no backend, torch's choice on a CPU host).
With ``PAUSE_STEP`` and ``PAUSE_FLAG`` set, rank 0 writes ``PAUSE_FLAG.paused`` before
that training step and waits for ``PAUSE_FLAG`` (the others wait in DDP's first bucket):
a test faults the links meanwhile.

Each rank writes ``OUT/rank<r>.json``: the backend torch says the world is on, the
collectives' results, each step's loss, the parameters after training and, when
``cclctl run`` instruments the job, the records of cclctl's session:
[comm, seq, op, state, algo, epoch, attempt], and its ``counters`` (retries, link resumes).
"""

import datetime
import json
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

STEPS = 6
BUCKET_CAP_MB = 0.004  # several buckets for the model below (see model_job.py)

out = sys.argv[1]
no_backend = len(sys.argv) > 2 and sys.argv[2] == "none"
timeout = datetime.timedelta(seconds=60)
if no_backend:
    dist.init_process_group(timeout=timeout)
else:
    dist.init_process_group("gloo", timeout=timeout)
rank, world = dist.get_rank(), dist.get_world_size()
doc: dict = {"rank": rank, "backend": dist.get_backend(), "results": {}}


def collectives() -> None:
    t = torch.arange(6, dtype=torch.float32) + rank
    dist.all_reduce(t)
    parts = [torch.zeros(6) for _ in range(world)]
    dist.all_gather(parts, t * (rank + 1))
    b = torch.full((3,), float(rank))
    dist.broadcast(b, src=world - 1)
    mine = torch.zeros(2)
    dist.reduce_scatter_tensor(mine, torch.arange(2.0 * world) * (rank + 1))
    sub = dist.new_group(list(range(world)))
    s = torch.ones(3) * (rank + 1)
    dist.all_reduce(s, group=sub)
    values = {"all_reduce": t, "all_gather": torch.cat(parts), "broadcast": b,
              "reduce_scatter": mine, "subgroup": s}  # fmt: skip
    doc["results"] = {k: v.tolist() for k, v in values.items()}
    doc["subgroup_backend"] = dist.get_backend(sub)


def train() -> None:
    torch.manual_seed(0)
    layers = [torch.nn.Linear(32, 40), torch.nn.Linear(40, 32), torch.nn.Linear(32, 8)]
    net = DistributedDataParallel(torch.nn.Sequential(*layers), bucket_cap_mb=BUCKET_CAP_MB)
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(100 + rank)  # each rank its own data
    losses = []
    for step in range(STEPS):
        if rank == 0 and step == int(os.environ.get("PAUSE_STEP", "-1")):
            pause(os.environ["PAUSE_FLAG"])
        loss = net(torch.randn(16, 32, generator=gen)).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        total = loss.detach().clone()
        dist.all_reduce(total)
        losses.append(total.item())
    doc["losses"] = losses
    doc["params"] = [p.detach().flatten().tolist() for p in net.parameters()]


def pause(flag: str) -> None:
    with open(f"{flag}.tmp", "w"):
        pass
    os.replace(f"{flag}.tmp", f"{flag}.paused")
    give_up = time.monotonic() + 120  # a backstop: the test releases it first
    while not os.path.exists(flag) and time.monotonic() < give_up:
        time.sleep(0.02)


def counters(sess) -> dict:
    view = sess.telemetry.metrics_view()
    retries = sum(st.retries for st in view.ops.values())
    return {"retries": retries, "link_resumes": sum(view.link_resumes.values())}


def records() -> list | None:
    wrap = sys.modules.get("cclctl.integrations.torch.wrap")
    sess = wrap.session() if wrap else None
    if sess is None:
        return None
    deadline = time.monotonic() + 10
    while sess.telemetry.inflight() and time.monotonic() < deadline:
        time.sleep(0.01)  # a traced gloo call's record closes at its work's completion
    doc["counters"] = counters(sess)
    return [
        [r.comm, r.seq, r.op, r.state, r.algo, r.epoch, r.attempt] for r in sess.telemetry.records()
    ]


collectives()
train()
doc["records"] = records()
with open(os.path.join(out, f"rank{rank}.json"), "w") as fh:
    json.dump(doc, fh)
dist.destroy_process_group()
