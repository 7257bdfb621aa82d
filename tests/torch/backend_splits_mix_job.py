"""A job on the ``cclctl`` backend whose rank 0 calls ``all_to_all_single`` without splits
and whose other ranks call it with splits, for test_torch_backend.py: torch allows it, the
ranks cannot agree on it. Each rank prints ``failed <error>`` (or ``completed``)."""

import datetime

import torch
import torch.distributed as dist

import cclctl.torch  # noqa: F401  # registers the backend

dist.init_process_group("cclctl", timeout=datetime.timedelta(seconds=120))
rank, world = dist.get_rank(), dist.get_world_size()
src, out = torch.arange(2.0 * world), torch.empty(2 * world)
try:
    if rank == 0:
        dist.all_to_all_single(out, src)
    else:
        dist.all_to_all_single(out, src, [2] * world, [2] * world)
    print("completed", flush=True)
except Exception as exc:  # the call's error, as torch raises it
    print(f"failed {exc}", flush=True)
dist.destroy_process_group()
