"""One rank of a gloo sweep whose buffers live in twins, as they do on a GPU with NCCL (here
the twins are CPU copies), so the upload/download logic is checked without a GPU.
Prints the total of wrong elements over every row.
"""

import torch
import torch.distributed as dist

from cclctl.benchmark.options import build_options
from cclctl.benchmark.sweep import Sweep
from cclctl.benchmark.torch_backend import TorchComm

dist.init_process_group("gloo")
comm = TorchComm(dist, "gloo", device=torch.device("cpu"))
ops = "all_reduce,all_gather,reduce_scatter,broadcast,reduce,alltoall,sendrecv"
opts = build_options(
    collective=ops, minbytes="8", maxbytes="4K", stepfactor=8, iters=3, warmup_iters=1
)
rows = list(Sweep(comm, opts).rows())
wrong = sum((r.out_of_place.wrong or 0) + (r.in_place.wrong or 0) for r in rows)
print(f"rows {len(rows)} wrong {wrong}", flush=True)
comm.close()
