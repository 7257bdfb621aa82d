"""An instrumented gloo job whose last rank never enters an all_reduce, seen two ways at
once: cclctl's live statuses and PyTorch's own Flight Recorder dumps.

``python fr_parity_job.py FLAGS [gather]`` under ``cclctl run -- torchrun``: every rank
runs two all_reduces, a sub-group all_reduce (ranks 0 and 1), with ``gather`` a gather to
rank 0 (which cclctl does not trace, so its seqs and torch's part from there), and a
barrier; then every rank but the last issues the world group's next all_reduce (async, so
it can still dump) and the last one stays in its own code. The test steers the rest
through files in FLAGS:

- ``FLAGS/dump`` (made by the test once it has diagnosed the live job): each rank writes
  ``FLAGS/fr/pickle/nccl_trace_rank_<r>`` (``_dump_fr_trace``) and
  ``FLAGS/fr/json/fr_rank<r>.json`` (``_dump_fr_trace_json``), then ``FLAGS/dumped<r>``;
- ``FLAGS/go``: the last rank enters the all_reduce, and the job ends normally.

The first ``_dump_fr_trace()`` of a process takes seconds (torch sets up its stack
symbolizer), so a thread makes one while the job runs.
"""

import datetime
import os
import sys
import threading
import time

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import _dump_fr_trace, _dump_fr_trace_json

flags, gather = sys.argv[1], sys.argv[2:] == ["gather"]
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])


def wait_for(name: str, within_s: float = 90.0) -> None:
    """Poll for FLAGS/<name> (made by the test); leave with an error past ``within_s``."""
    deadline = time.monotonic() + within_s
    while not os.path.exists(os.path.join(flags, name)):
        if time.monotonic() > deadline:
            print(f"rank {rank}: no {name} within {within_s:g}s", flush=True)
            os._exit(1)
        time.sleep(0.05)


dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
warm = threading.Thread(target=_dump_fr_trace)
warm.start()
t = torch.ones(8)
for _ in range(2):
    dist.all_reduce(t)
sub = dist.new_group([0, 1])
if rank in (0, 1):
    dist.all_reduce(t, group=sub)
if gather:
    dist.gather(t, [torch.zeros(8) for _ in range(world)] if rank == 0 else None, dst=0)
dist.barrier()
last = rank == world - 1
work = None if last else dist.all_reduce(t, async_op=True)  # the last rank: busy elsewhere
warm.join()
wait_for("dump")
for fmt, name, dump in (
    ("pickle", f"nccl_trace_rank_{rank}", _dump_fr_trace),
    ("json", f"fr_rank{rank}.json", _dump_fr_trace_json),
):
    os.makedirs(os.path.join(flags, "fr", fmt), exist_ok=True)
    with open(os.path.join(flags, "fr", fmt, name), "wb") as fh:
        fh.write(dump())
open(os.path.join(flags, f"dumped{rank}"), "w").close()
wait_for("go")
if work is None:
    work = dist.all_reduce(t, async_op=True)
work.wait()
assert t[0].item() == world**2 * (world + 2), t  # x world, x world, x 2 on 0-1, sum
dist.destroy_process_group()
print(f"rank {rank} done", flush=True)
