"""A job on the ``cclctl`` backend whose rank 1 waits in its own code while the others block
in an all_reduce, for test_torch_backend_hang.py. Run under torchrun:
``python backend_hang_job.py FLAG``. The other ranks write ``FLAG.entered`` (the seq of the
all_reduce they are about to enter) first; rank 1 goes on once FLAG exists.
"""

import datetime
import os
import sys
import time

import torch
import torch.distributed as dist

import cclctl.torch  # noqa: F401  # registers the backend

flag = sys.argv[1]
dist.init_process_group("cclctl", timeout=datetime.timedelta(seconds=120))
rank = dist.get_rank()
t = torch.ones(16)
for _ in range(3):
    dist.all_reduce(t)
seq = dist.group.WORLD.comm.completed + 1
if rank == 1:
    while not os.path.exists(flag):
        time.sleep(0.05)  # rank 1 "never enters" until the test lets it go
else:
    with open(f"{flag}.entered.tmp{rank}", "w") as f:
        f.write(str(seq))
    os.replace(f"{flag}.entered.tmp{rank}", f"{flag}.entered{rank}")
dist.all_reduce(t)
dist.destroy_process_group()
