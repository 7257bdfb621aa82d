"""A gloo training-like loop whose PyTorch Flight Recorder dumps ``diagnose slow`` reads.

``python fr_slow_job.py OUT SLOW_RANK STEPS STEP_MS EXTRA_MS``: every rank runs STEPS steps
of STEP_MS of "compute" (a sleep) and an all_reduce; rank SLOW_RANK (-1: none) computes
EXTRA_MS more per step, a compute straggler the others wait for inside their all_reduce.
At the end every rank writes its Flight Recorder dump, ``OUT/nccl_trace_rank_<r>``
(``_dump_fr_trace``, as PyTorch names them). Not traced by cclctl: the dumps are the only
record of the job. TORCH_FR_BUFFER_SIZE (set by the test) must hold every step.
"""

import datetime
import os
import sys
import time

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import _dump_fr_trace

out, slow_rank, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
step_s, extra_s = float(sys.argv[4]) / 1e3, float(sys.argv[5]) / 1e3
rank = int(os.environ["RANK"])

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
t = torch.ones(1024)
dist.barrier()
for _ in range(steps):
    time.sleep(step_s + (extra_s if rank == slow_rank else 0.0))
    dist.all_reduce(t)
    t.fill_(1.0)
dist.barrier()
with open(os.path.join(out, f"nccl_trace_rank_{rank}"), "wb") as fh:
    fh.write(_dump_fr_trace())
dist.destroy_process_group()
print(f"rank {rank} done", flush=True)
