"""A job on the ``cclctl`` backend whose ``new_group`` of ranks 1 and 2 rides through a link
fault, for test_torch_subgroup_retry.py. Run under a launcher (RANK, WORLD_SIZE, MASTER_*):
``python subgroup_retry_job.py OUT``.

The members run three all_reduces on the group (whole numbers: exact in any order), every
rank then one on the world; each rank writes ``OUT/rank<r>.json``: the group's id and
results, the world's result, and cclctl's records [comm, seq, op, state, epoch, attempt].
"""

import datetime
import json
import os
import sys

import torch
import torch.distributed as dist

import cclctl.torch  # noqa: F401  # registers the backend

MEMBERS = [1, 2]
out_dir = sys.argv[1]
dist.init_process_group("cclctl", timeout=datetime.timedelta(seconds=60))
rank, world = dist.get_rank(), dist.get_world_size()
doc: dict = {"rank": rank, "sub": []}
sub = dist.new_group(MEMBERS)
if rank in MEMBERS:
    doc["sub_comm"] = sub.comm.id
    for i in range(3):
        t = torch.arange(4096, dtype=torch.float32) * (rank + 1) + i
        dist.all_reduce(t, group=sub)
        doc["sub"].append([*t.tolist()[:8], float(t.double().sum())])
w = torch.full((8,), float(rank + 1))
dist.all_reduce(w)
doc["world"] = w.tolist()
telemetry = dist.group.WORLD.comm.tracer
records = sorted(telemetry.records(), key=lambda r: (r.comm, r.seq, r.attempt))
doc["records"] = [[r.comm, r.seq, r.op, r.state, r.epoch, r.attempt] for r in records]
dist.destroy_process_group()
with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
    json.dump(doc, f)
