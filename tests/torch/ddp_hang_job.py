"""A DDP training job in which rank 1 stops before its forward pass at one step, so the
other ranks block inside DDP's gradient all_reduce. It never calls cclctl.
Run under torchrun (RANK, WORLD_SIZE, MASTER_*).

``python ddp_hang_job.py HOW STEP FLAG``: at step STEP (from 1) rank 1 either ``stop``s
(SIGSTOP to itself; the test resumes or kills it) or ``wait``s in its own code until FLAG
exists. Every rank writes FLAG.<rank>.step<k> (an empty file) before step k's forward pass,
holding ``<pid> <seq>``, the seq torch's gloo backend will give the step's gradient
all_reduce (the model is one bucket), so a test knows when the others have entered the step
and which call they wait in. After STEP the job runs one more step and ends.
"""

import datetime
import os
import signal
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

how, hang_step, flag = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3])
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
rank = dist.get_rank()
torch.manual_seed(0)
layers = [torch.nn.Linear(32, 40), torch.nn.ReLU(), torch.nn.Linear(40, 8)]
net = DistributedDataParallel(torch.nn.Sequential(*layers))
gloo = dist.distributed_c10d._get_default_group()._get_backend(torch.device("cpu"))

for step in range(1, hang_step + 2):
    if rank == 1 and step == hang_step:
        if how == "stop":
            os.kill(os.getpid(), signal.SIGSTOP)
        else:
            while not flag.exists():
                time.sleep(0.05)
    seq = gloo._get_sequence_number_for_group() + 1
    Path(f"{flag}.{rank}.step{step}").write_text(f"{os.getpid()} {seq}")
    net(torch.randn(8, 32)).sum().backward()
dist.destroy_process_group()
