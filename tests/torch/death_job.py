"""A torch.distributed (gloo) job in which rank 2 SIGKILLs itself inside its loop of
all_reduces. It never calls cclctl. Run under torchrun (RANK, WORLD_SIZE, MASTER_*).

``python death_job.py FOLDER [uncaught|busy]``: each rank writes FOLDER/pid.<rank> at
start; rank 2 kills itself before its 6th all_reduce; a survivor whose all_reduce raises
writes the error's first line to FOLDER/error.<rank> and then waits to be stopped by its
launcher, or, with ``uncaught``, lets the error end it (as a training script that catches
nothing does). With ``busy`` the survivors compute (sleep) before their 6th all_reduce
until their launcher stops them: no call of theirs ever fails.
"""

import datetime
import os
import signal
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

folder = Path(sys.argv[1])
uncaught = sys.argv[2:] in (["uncaught"], ["busy"])
busy = sys.argv[2:] == ["busy"]
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
rank = dist.get_rank()
(folder / f"pid.{rank}").write_text(str(os.getpid()))
t = torch.ones(1 << 12)
try:
    for step in range(1, 10_000):
        if rank == 2 and step == 6:
            os.kill(os.getpid(), signal.SIGKILL)
        if busy and step == 6:
            time.sleep(120)  # a long step: torchrun stops this rank inside it
        dist.all_reduce(t)
        t.fill_(1.0)
except RuntimeError as exc:
    (folder / f"error.{rank}").write_text(str(exc).splitlines()[0])
    if uncaught:
        raise
    time.sleep(60)  # torchrun stops the survivors once it sees rank 2 gone
