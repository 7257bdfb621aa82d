"""A DDP training loop with one rank slower in its forward pass, for `cclctl diagnose slow`.
It never calls cclctl. Run under torchrun (RANK, WORLD_SIZE, MASTER_*).

``python slow_ddp_job.py RELEASE``: every step runs forward (which sleeps ``STEP_S``
seconds, as a host thread waits for a GPU's kernels; ``SLOW_EXTRA`` more on rank
``SLOW_RANK``), backward (DDP all_reduces the gradients in buckets) and an optimiser step,
then all_reduces a stop flag that rank 0 raises once the file RELEASE exists, so every
rank stops after the same step. DDP's all_reduce inside backward evens out the step times:
the slow rank's steps last as long as everyone's.
"""

import datetime
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

GIVE_UP_S = 300

release = sys.argv[1]
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
rank = dist.get_rank()
torch.manual_seed(0)
step_s = float(os.environ.get("STEP_S", "0.03"))
slow = rank == int(os.environ.get("SLOW_RANK", "-1"))
compute_s = step_s * (1 + float(os.environ.get("SLOW_EXTRA", "0.3"))) if slow else step_s


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.Sequential(
            torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256),
            torch.nn.ReLU(), torch.nn.Linear(256, 8),
        )  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(compute_s)  # the rank's compute
        return self.layers(x)


model = DistributedDataParallel(Net(), bucket_cap_mb=0.1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
stop = torch.zeros(1)
deadline = time.monotonic() + GIVE_UP_S
step = 0
while True:
    loss = model(torch.randn(16, 64)).square().mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    step += 1
    if step == 1:
        print(f"rank {rank} pid {os.getpid()} stepping", flush=True)
    stop[0] = 1.0 if rank == 0 and (os.path.exists(release) or time.monotonic() > deadline) else 0
    dist.all_reduce(stop)
    if stop[0] > 0:
        break
dist.destroy_process_group()
print(f"rank {rank} done after {step} steps", flush=True)
