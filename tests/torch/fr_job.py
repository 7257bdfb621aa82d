"""A gloo job that hangs on purpose and writes PyTorch's own Flight Recorder dumps.

``python fr_job.py SCENARIO OUT_DIR`` under a launcher (RANK, WORLD_SIZE, MASTER_*):
every rank runs two all_reduces, a sub-group call (ranks 0 and 1) and a barrier, then the
incident at the world group's next seq:

- ``not_entered``: the last rank never enters the all_reduce the others wait in;
- ``mismatch``: the last rank calls broadcast where the others call all_reduce.

The first ``_dump_fr_trace()`` of a process takes seconds (torch sets up its stack
symbolizer), so a thread makes one while the job runs. Calls are async so that every rank
can dump while the collective hangs (nothing special is enabled: gloo records by default).
Each rank writes ``OUT_DIR/pickle/nccl_trace_rank_<r>``
(``_dump_fr_trace``) and ``OUT_DIR/json/fr_rank<r>.json`` (``_dump_fr_trace_json``), then
leaves, once all ranks have dumped, without waiting on the hung work.
"""

import datetime
import os
import sys
import threading
import time

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import _dump_fr_trace, _dump_fr_trace_json

scenario, out = sys.argv[1], sys.argv[2]
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=30))
warm = threading.Thread(target=_dump_fr_trace)
warm.start()
t = torch.ones(8)
for _ in range(2):
    dist.all_reduce(t)
sub = dist.new_group([0, 1])
if rank in (0, 1):
    dist.all_reduce(t, group=sub)
dist.barrier()
last = rank == world - 1
if scenario == "not_entered" and last:
    pass  # busy elsewhere: never enters
elif scenario == "mismatch" and last:
    dist.broadcast(t, 0, async_op=True)
else:
    dist.all_reduce(t, async_op=True)
time.sleep(1.5)  # the hang itself: dumped later than the tests' 1 s stuck_after_s
warm.join()
for fmt, name, dump in (
    ("pickle", f"nccl_trace_rank_{rank}", _dump_fr_trace),
    ("json", f"fr_rank{rank}.json", _dump_fr_trace_json),
):
    os.makedirs(os.path.join(out, fmt), exist_ok=True)
    with open(os.path.join(out, fmt, name), "wb") as fh:
        fh.write(dump())
# Leave only once every rank has dumped: a rank that exits breaks its links, and gloo then
# ends (and retires) the call the others still wait in.
open(os.path.join(out, f"done{rank}"), "w").close()
deadline = time.monotonic() + 30
while time.monotonic() < deadline:
    if all(os.path.exists(os.path.join(out, f"done{r}")) for r in range(world)):
        break
    time.sleep(0.05)
print("dumped", flush=True)
os._exit(0)
